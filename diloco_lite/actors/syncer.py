"""Decoupled DiLoCo's syncer on the wall clock: the state machine, driven by real events.

`SyncerRuntime` is the real runtime's twin of `clock.syncer.plan_decoupled`: the same
`SyncerState` decides (quorum, grace, token weights, failures, the flush) and the same link
model (`clock.Links`) says when a reply reaches the learners; the learners' own rules run on
the learners (`actors.agent`). Times are seconds of wall clock since the run's start `t0`.
`SyncerRuntime` is the surface the Ray actor calls (`actors.ray_actors`); it wires the parts,
each an object with its own state: `Timers` (`actors.timers`: its events in order, its clock),
`Syncs` (`actors.syncs`: the state machine's actions carried out: asks, closes, publishes),
`Merges` and `End` (`actors.merging`: the merges, computed off the lock; the end and its
flush), `Rejoins` (`actors.rejoins`), `Roster` (`actors.roster`: where the learners are
between their reports), `Mailbox` (`actors.mailbox`: the messages to each learner's process)
and `Books` (`actors.booking`: the run booked in `clock.booking`'s order).

The messages (nothing else crosses a link, apart from a rejoin's):

- learner → syncer, an **answer** (`answered`): Δ through the wire format, with the learner's
  report of what it did since its last message (`actors.booking` books it);
- syncer → each learner up, at each close (`outbox`): a **publish** notice, sent at once, with
  the time it counts from (when the clock's links deliver the last copy of the reply: the
  syncer's M copies leave one after the other), whether the learner's own answer is in the
  merge, and when the next ask of that fragment comes; then, once the merge is computed, the
  **reply**: the merged fragment (Θ_p, or its `down_bits` update). The notice goes ahead so
  that a learner knows at its step boundary whether it applies the fragment there, however
  long the merge takes (it waits for the reply's bytes only then). The first asks are
  announced at the start (`start`), with each learner's stop position (`actors.budget`;
  changed by a failure or a rejoin: a "stop" message). Each message to a learner's process is
  numbered, in the order sent;
- learner → syncer, **until** (`until`), only at a step boundary where a notice it has not
  heard yet could change what it does (`LearnerAgent.unsure`): once the syncer has handled
  every event up to that instant, it says how many messages it has sent that learner, and the
  learner waits for them all. So what a learner does at a boundary never depends on how long a
  message took (a close just before its boundary, whose notice comes `hold_s` and a latency
  later, is heard in time).

The syncer's own events (the asks, the grace deadlines, the answers, each stamped with the time
it reached the syncer, and the publishes) are handled in order of time `hold_s` after it, so
that at equal times the order is the simulated clock's (`advance`; `decided`: every event
before it is handled); a publish waits for its merge. Nothing after the budget's last step is
handled but the publishes of merges closed before it (as on the simulated clock): until every
learner has stopped, events after the end its step times predict wait, unless a learner's
`until` says it has a step boundary after it (then the run ends no earlier). An event that
comes after a later one was handled (an answer held up longer than `hold_s`) is handled at the
syncer's clock, re-stamped; `status()` and `result()` count them (`restamped`). Nothing here
imports Ray; `actors.ray_actors` calls these methods from Ray's threads, under a lock.
"""

from __future__ import annotations

import math

from ..clock import Links, Timeline
from ..clock.booking import ASK, DEADLINE, END, FAIL, PUBLISH, REJOIN, RESPONSE
from ..clock.recorder import Recorder
from ..clock.syncer_state import SyncerState
from ..training import eval_points
from ..validate import check_nonnegative
from .booking import Books
from .mailbox import Mailbox
from .merging import End, Merge, Merges
from .rejoins import Rejoins
from .roster import Roster
from .syncs import Syncs
from .theta import SyncerParams
from .timers import Timers

__all__ = ["Merge", "SyncerRuntime"]

_RESTAMPED = {ASK: "ask", DEADLINE: "deadline", RESPONSE: "answer"}  # (the names counted)


class SyncerRuntime:
    """The syncer of `config` (Decoupled DiLoCo) from `params` (None: the model's initial
    parameters for `config.seed`; module docstring)."""

    def __init__(self, config, params=None, hold_s: float = 0.01):
        check_nonnegative("hold_s", hold_s)
        self.theta = theta = SyncerParams(config, params)  # Θ, the outer states, the merges
        d = theta.driver
        self.M, self.P, self.hold = config.workers, len(d.frags), hold_s
        self.budget, self.tokens = config.workers * config.steps, config.batch_size * config.seq_len
        self.timeline = t = Timeline(config.cluster, self.M)
        self.down_nbytes = d.down_nbytes
        self.state = SyncerState(config.algorithm, self.M, t.t_ref,
                                 reply_s=lambda p, t: self.syncs.reply_s(p, t))
        recorder = lambda: Recorder(t, up_nbytes=d.up_nbytes, down_nbytes=d.down_nbytes,  # noqa: E731
                                    sizes=d.sizes, rejoin_nbytes=d.rejoin_nbytes,
                                    tokens_per_step=self.tokens, mix=d.alpha)
        theta0 = [theta.fragment(p) for p in range(self.P)]
        self.books = Books(recorder, self.M, config.steps, eval_points(config), theta0)
        self.events = Timers()  # the syncer's own events, and its clock
        self.mail = Mailbox(self.M)  # its messages to the learners' processes
        self.roster = Roster(t, self.P, self.state.tau, self.budget, self.mail)
        self.merges = Merges(theta, self.mail)
        self.rejoins = Rejoins(self.M, self.mail, self._load)
        self.ending = End(self.books, self.roster, self.tokens)
        self.syncs = Syncs(self.state, Links(t.cluster.link, self.M), self.down_nbytes,
                           self.events, self.merges, self.mail, self.books, theta0, self.tokens)

    # ---- what the Ray actor and the tests read --------------------------------------------------
    @property
    def outbox(self) -> list:
        """(learner, message, reply bytes or None, its process: life, its number) to send, in
        order; the actor sends them and clears it (`Mailbox`)."""
        return self.mail.outbox

    @property
    def up(self) -> list[bool]:  # (the state machine's: one truth)
        return self.state.up

    @property
    def end(self) -> float | None:
        """The time of the budget's last step, once known."""
        return self.ending.at

    @property
    def timers(self) -> list:
        """The events to handle: a heap of (time, kind, number, fragment, data) (`Timers`)."""
        return self.events.heap

    @property
    def reached(self) -> float:
        return self.events.reached

    @property
    def peer_of(self) -> dict:
        """Returning learner -> the peer asked for its inner optimizer state."""
        return self.rejoins.peer_of

    @property
    def restamped(self) -> int:
        """How many events were handled at the syncer's clock, after their own time
        (`Timers.stamp`)."""
        return sum(self.events.restamped.values())

    # ---- the learners ---------------------------------------------------------------------------
    def start(self) -> list[list]:
        """The run begins: each learner's first messages (the first asks, its stop)."""
        self.syncs.act(self.state.start(), 0.0)
        asks = [("ask", t, p, 0) for t, _, _, p, _ in self.events.of_kind(ASK)]
        return [self.roster.started(m, asks) for m in range(self.M)]

    def answered(self, m: int, life: int, p: int, n: int, payload, since: int, sent_at: float,
                 report: list, now: float) -> None:
        """Learner m's answer to the n-th sync of fragment p (Δ of `since` steps, sent at its
        boundary `sent_at`) reached the syncer at `now`, with its report."""
        if life != self.roster.life[m]:
            return  # from a process that has since been replaced
        self.reported(m, life, report)
        self.events.push(now, RESPONSE, p, (m, n, since, sent_at, payload))
        self.advance(now - self.hold, before=RESPONSE + 1)

    def reported(self, m: int, life: int, report: list, final: tuple | None = None) -> None:
        """Learner m's report (`LearnerAgent.take_report`); `final`: (position, held versions)
        when it has stopped at its stop position (after every answer it sent has arrived)."""
        if life != self.roster.life[m]:
            return
        self.books.learner(m, report)
        self.roster.reported(m, report)
        if final is not None:
            self.roster.final[m] = final
            self._check_end()

    def until(self, m: int, life: int, t: float) -> int | None:
        """Learner m is at its step boundary at t, unsure of what it does there
        (`LearnerAgent.unsure`): once every event up to that instant is handled, the number of
        messages its process has been sent (it waits for them all); None before. (A step
        boundary before its stop: the run ends no earlier.)"""
        if life != self.roster.life[m] or not self.up[m]:
            return 0  # a process the syncer holds as gone: nothing to wait for
        if self.end is not None:
            return self.mail.sent(m)  # (no event left to handle)
        self.events.reach(t)
        return self.mail.sent(m) if self.events.decided >= (t, FAIL) else None

    # ---- failures and rejoins (`actors.rejoins`) ------------------------------------------------
    def failed(self, m: int, now: float) -> None:
        """Learner m's process died: its unsynced work and its answers on the wire are lost; a
        rejoin it was waiting for is void. (Already down: only that.)"""
        self.rejoins.void(m)
        self.roster.final.pop(m, None)
        if not self.up[m]:
            return
        self.advance(now - self.hold, before=FAIL)
        t = self.events.stamp(now, "fail")
        began = self.roster.starts[m][2]
        self.books.learner(m, self.roster.failed(m, t, self.events.clock,
                                                 self.books.reported(m, after=began)))
        self.books.syncer(t, FAIL, "fail", m)
        self.syncs.act(self.state.failed(m, t), t, FAIL)
        self._check_end()
        for r in self.rejoins.waiting_on(m):  # it was to send its state to a returning learner
            self.rejoins.reload(r, now, self.up)  # ask another one

    def killed(self, m: int, now: float, for_good: bool = False) -> None:
        """The driver killed learner m's process (a failure window began; `for_good`: it never
        comes back): logged; it takes no more steps."""
        self.books.syncer(now, FAIL, "kill", m)
        self.roster.killed(m, now, self.events.clock, for_good)

    def rejoin(self, m: int, now: float) -> int:
        """Learner m is back (`Rejoins.rejoin`); returns its ticket for `take_rejoin`."""
        return self.rejoins.rejoin(m, now, self.up)

    def take_rejoin(self, m: int, ticket: int) -> tuple[str, dict | None]:
        """("ready", what it loads), ("wait", None) or ("gone", None) (`Rejoins.take`)."""
        return self.rejoins.take(m, ticket, ended=self.end is not None)

    def peer_state(self, q: int, inner_state, t: float) -> None:
        """Peer q's inner optimizer state, uploaded at its step boundary t."""
        self.rejoins.peer_state(q, inner_state, t)

    # ---- the merges and the end (`actors.merging`) ----------------------------------------------
    def next_merge(self) -> Merge | None:
        """The next closed sync to merge; `merged` it when done."""
        return self.merges.next()

    @property
    def busy(self) -> bool:
        """A merge is queued or being computed."""
        return self.merges.busy

    def merge(self, job: Merge):
        """`Merges.compute` (no lock needed)."""
        return self.merges.compute(job)

    def merged(self, job: Merge, result) -> None:
        self.merges.merged(job, result)

    def flushes(self) -> list | None:
        """At the end (every learner up has stopped; call again until it says otherwise): the
        fragments to flush and the learners whose Δ each takes (`Merge` jobs without payloads
        yet); None while a merge is left to compute or publish."""
        if self.end is None:
            return None
        self.advance(math.inf)
        if self.busy or self.events.of_kind(PUBLISH):
            return None
        return self.ending.plan(self.state)

    def flush(self, job: Merge) -> None:
        """The flush of `job` (its payloads in), merged and booked."""
        self.merges.merged(job, self.merges.compute(job))
        self.ending.booked(job)

    def result(self) -> dict:
        """The history rows (stats, diagnostics, Θ), the losses, the log, the recorded plan, Θ,
        and the events re-stamped: how many, and of which kinds (`Timers.stamp`)."""
        return dict(self.ending.result(self.theta.assemble), params=self.theta.params(),
                    restamped=self.restamped, restamped_kinds=dict(self.events.restamped))

    def status(self) -> dict:
        """Where the run is: learner-steps taken, the end once known, who is up, whether a
        merge is left, each learner's stop, the events re-stamped so far."""
        return dict(processed=self.roster.processed(self.up, self.events.clock),
                    ending=self.end, up=list(self.up), merging=self.busy,
                    stop=list(self.roster.stop), restamped=self.restamped)

    # ---- the syncer's own work ------------------------------------------------------------------
    def advance(self, to: float, before: int = 99) -> None:
        """Handle the events due before (to, before) in order of time (module docstring)."""
        ev = self.events
        while (first := ev.first()) is not None and first[:2] < (to, before):
            t, kind, _, p, data = first
            if kind == PUBLISH and data.result is None:
                ev.decide((t, kind))
                return  # its merge is still being computed
            if kind != PUBLISH and self.end is not None and (t, kind) >= (self.end, END):
                ev.pop()
                continue  # after the end
            predicted = self.roster.predicted_end
            if kind != PUBLISH and self.end is None and predicted is not None \
                    and t > max(predicted, ev.reached):
                ev.decide((t, kind))
                return  # after the end the step times predict: wait for the learners
            ev.pop()
            # a publish counts from the time its notice gave the learners (they apply on it),
            # even when its merge was computed later than that; any other event comes at the
            # syncer's clock if a later one was handled before it came (re-stamped, counted)
            clock = ev.stamp(t, _RESTAMPED.get(kind))
            if kind == ASK:
                self.books.syncer(clock, ASK, "ask", p)
                self.syncs.act(self.state.ask(p, clock), clock, ASK)
            elif kind == DEADLINE:
                self.syncs.act(self.state.deadline(p, data, clock), clock, DEADLINE)
            elif kind == PUBLISH:
                self.syncs.published(data, t)
            else:
                self.syncs.arrived(p, *data, clock)
        ev.decide((to, before))

    # ---- helpers --------------------------------------------------------------------------------
    def _load(self, m: int, peer: int, inner_state, t: float) -> dict:
        """What returning learner m loads at t (`Rejoins`): Θ as published by then, `peer`'s
        inner optimizer state (`FRESH`: a fresh one), and its messages: the open syncs it had
        not answered, the asks to come, the notice of each merge in flight (its reply follows,
        at once if merged), its stop."""
        t = self.events.stamp(t, "reload")
        self.books.syncer(t, REJOIN, "reload", m, peer)
        messages, held, fragments, flying = self.syncs.back(m, t)
        k = self.roster.last[m][0]
        messages = self.roster.started(m, messages, k, held, t, now=self.events.clock)
        for job in flying:  # a merge in flight: its notice above, its reply once merged
            self.merges.tell(job, m)
        return dict(leaves=self.theta.assemble(fragments), inner=inner_state, k=k, t=t,
                    messages=messages, versions=held, life=self.mail.life[m])

    def _check_end(self) -> None:
        if self.ending.check(self.up):
            self._by_the_end()

    def _by_the_end(self) -> None:
        """An answer that arrived after the end, but that the clock's link would have carried by
        then (sent by the end: on loopback's free link, at once), counts as arrived then."""
        link, end = self.timeline.cluster.link, self.end

        def arrived(t, kind, p, data):
            if kind == RESPONSE and t > end:
                sent = data[3] + link.busy_s(self.theta.nbytes(p)) + link.latency_s
                return sent if sent <= end else None
            return None

        self.events.retime(arrived)
