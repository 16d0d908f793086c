"""Decoupled DiLoCo's syncer on the wall clock: the state machine, driven by real events.

`SyncerRuntime` is the real runtime's twin of `clock.syncer.plan_decoupled`: the same
`SyncerState` decides (quorum, grace, token weights, failures, the flush) and the same link
model (`clock.Links`) says when a reply reaches the learners; the learners' own rules run on
the learners (`actors.agent`). Times are seconds of wall clock since the run's start `t0`.

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
  changed by a failure or a rejoin: a "stop" message).

The syncer's own events (the asks, the grace deadlines, the answers, each stamped with the time
it reached the syncer, and the publishes) are handled in order of time `hold_s` after it, so
that at equal times the order is the simulated clock's; a publish waits for its merge, which is
computed off the lock (`next_merge`/`merge`/`merged`). Nothing after the budget's last step is
handled but the publishes of merges closed before it (as on the simulated clock): until every
learner has stopped, events after the end its step times predict wait.

A returning learner's `rejoin` gives a ticket (a later failure of the same learner voids it:
`take_rejoin`); it reloads Θ as published and a healthy peer's inner optimizer state, uploaded
at the peer's next step boundary (an "upload" message), or a fresh one with no peer up. A
learner killed after its last report is booked with the steps its step times give until the
kill. The end: `flushes()` once every learner up has stopped and no merge is left, then
`flush` each, then `result()`. Nothing here imports Ray; `actors.ray_actors` calls these
methods from Ray's threads, under a lock.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

from ..clock import Links, Timeline
from ..clock.learner_rules import FRESH, book_flush, flush_weights, peer_of
from ..clock.recorder import Recorder
from ..clock.syncer import ASK, DEADLINE, END, FAIL, PUBLISH, REJOIN, RESPONSE
from ..clock.syncer_state import Ask, AskAt, Close, SetDeadline, SyncerState
from ..training import eval_points
from ..validate import check_nonnegative
from .booking import Books
from .roster import Roster
from .theta import SyncerParams


@dataclasses.dataclass
class Merge:
    p: int
    n: int  # the sync's number among fragment p's
    weights: dict  # learner -> weight
    receivers: tuple  # the learners up at the close: one reply each
    wait_s: float
    payloads: dict  # learner -> bytes
    flush: bool = False
    closed_at: float = 0.0
    published_at: float = 0.0  # when the clock's links deliver the last reply
    next_ask: float = math.inf
    result: tuple | None = None  # (Θ_p leaves, diagnostics), once merged
    reply: object = None  # the reply's bytes, once merged
    told: dict = dataclasses.field(default_factory=dict)  # learner -> its process (life) that
    # has the publish notice: the reply goes to each


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
        self.links = Links(t.cluster.link, self.M)  # the clock's model of the replies
        self.down_nbytes = d.down_nbytes
        self.state = SyncerState(config.algorithm, self.M, t.t_ref, send_back_s=self._send_back)
        self.recorder = lambda: Recorder(t, up_nbytes=d.up_nbytes, down_nbytes=d.down_nbytes,  # noqa: E731
                                         sizes=d.sizes, rejoin_nbytes=d.rejoin_nbytes,
                                         tokens_per_step=self.tokens, mix=d.alpha)
        self.versions = [[(0.0, theta.fragment(p))] for p in range(self.P)]  # (publish, Θ_p)
        self.books = Books(self.recorder, self.M, config.steps, eval_points(config),
                           [v[0][1] for v in self.versions])
        self.timers, self.seq, self.clock, self.kind = [], itertools.count(), 0.0, ASK
        self.decided = (0.0, ASK)  # every event before it is handled (a learner waits on it)
        self.reached = 0.0  # the latest step boundary a learner is known to be at
        self.asked_n = [0] * self.P  # each fragment's asks so far: the next one's number
        self.open: list = [None] * self.P  # p's open sync: (its id, its number)
        self.payloads = [{} for _ in range(self.P)]  # the open sync's answers
        self.merges: list[Merge] = []  # closed, to compute
        self.merging = 0  # handed out (`next_merge`), not merged yet
        self.outbox: list = []  # (learner, message, reply bytes or None, its process: life)
        self.roster = Roster(t, self.P, self.state.tau, self.budget, self.outbox)
        self.done: float | None = None  # the end's time, once the flush is planned
        self.flushed: list = []  # (fragment, Θ_p leaves, diagnostics) of the flush
        self.peer_of: dict = {}  # returning learner -> the peer asked for its inner state
        self.rejoined: dict = {}  # returning learner -> what it loads
        self.tickets = [0] * self.M
        self.end: float | None = None  # the time of the budget's last step, once known
        self.flushing = False

    # ---- the learners ---------------------------------------------------------------------------
    @property
    def up(self) -> list[bool]:
        return self.state.up

    def start(self) -> list[list]:
        """The run begins: each learner's first messages (the first asks, its stop)."""
        self._act(self.state.start(), 0.0)
        asks = [("ask", t, p, 0) for t, kind, _, p, _ in self.timers if kind == ASK]
        return [self.roster.started(m, asks) for m in range(self.M)]

    def answered(self, m: int, life: int, p: int, n: int, payload, since: int, sent_at: float,
                 report: list, now: float) -> None:
        """Learner m's answer to the n-th sync of fragment p (Δ of `since` steps, sent at its
        boundary `sent_at`) reached the syncer at `now`, with its report."""
        if life != self.roster.life[m]:
            return  # from a process that has since been replaced
        self.reported(m, life, report)
        heapq.heappush(self.timers, (now, RESPONSE, next(self.seq), p,
                                     (m, n, since, sent_at, payload)))
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

    def failed(self, m: int, now: float) -> None:
        """Learner m's process died: its unsynced work and its answers on the wire are lost; a
        rejoin it was waiting for is void. (Already down: only that.)"""
        self.tickets[m] += 1
        self.peer_of.pop(m, None)
        self.rejoined.pop(m, None)
        self.roster.final.pop(m, None)
        if not self.up[m]:
            return
        self.advance(now - self.hold, before=FAIL)
        t = self._now(now)
        began = self.roster.starts[m][2]
        self.books.learner(m, self.roster.failed(m, t, self.clock,
                                                 self.books.reported(m, after=began)))
        self.books.syncer(t, FAIL, "fail", m)
        self.kind = FAIL
        self._act(self.state.failed(m, t), t)
        self._check_end()
        for r, q in list(self.peer_of.items()):
            if q == m:  # it was to send its state to a returning learner: ask another one
                del self.peer_of[r]
                self._reload(r, now)

    def killed(self, m: int, now: float, for_good: bool = False) -> None:
        """The driver killed learner m's process (a failure window began; `for_good`: it never
        comes back): logged; it takes no more steps."""
        self.books.syncer(now, FAIL, "kill", m)
        self.roster.killed(m, now, self.clock, for_good)

    def rejoin(self, m: int, now: float) -> int:
        """Learner m is back: it reloads at the next step boundary of a healthy peer, which
        uploads its inner optimizer state (`peer_state`); with no peer up, at once, with a fresh
        one. Returns its ticket for `take_rejoin`."""
        self.tickets[m] += 1
        self.rejoined.pop(m, None)
        self._reload(m, now)
        return self.tickets[m]

    def take_rejoin(self, m: int, ticket: int) -> tuple[str, dict | None]:
        """("ready", what it loads) once learner m's rejoin `ticket` has it, ("wait", None)
        before, ("gone", None) when the ticket is void or the run has ended."""
        if ticket != self.tickets[m]:
            return "gone", None
        if m in self.rejoined:
            return "ready", self.rejoined.pop(m)
        if self.end is not None:
            self.peer_of.pop(m, None)
            return "gone", None
        return "wait", None

    def peer_state(self, q: int, inner_state, t: float) -> None:
        """Peer q's inner optimizer state, uploaded at its step boundary t."""
        for m in [r for r, peer in self.peer_of.items() if peer == q]:
            del self.peer_of[m]
            self._back(m, q, inner_state, t)

    def until(self, m: int, life: int, t: float) -> int | None:
        """Learner m is at its step boundary at t, unsure of what it does there
        (`LearnerAgent.unsure`): once every event up to that instant is handled, the number of
        messages its process has been sent (it waits for them all); None before. (A step
        boundary before its stop: the run ends no earlier.)"""
        if life != self.roster.life[m] or not self.up[m] or self.end is not None:
            return len(self.roster.heard[m])  # (it has no decision left to wait for)
        self.reached = max(self.reached, t)
        return len(self.roster.heard[m]) if self.decided >= (t, FAIL) else None

    # ---- the syncer's own work ------------------------------------------------------------------
    def advance(self, to: float, before: int = 99) -> None:
        """Handle the events due before (to, before) in order of time (module docstring)."""
        while self.timers and self.timers[0][:2] < (to, before):
            t, kind, _, p, data = self.timers[0]
            if kind == PUBLISH and data.result is None:
                self.decided = max(self.decided, (t, kind))
                return  # its merge is still being computed
            if kind != PUBLISH and self.end is not None and (t, kind) >= (self.end, END):
                heapq.heappop(self.timers)
                continue  # after the end
            predicted = self.roster.predicted_end
            if kind != PUBLISH and self.end is None and predicted is not None \
                    and t > max(predicted, self.reached):
                self.decided = max(self.decided, (t, kind))
                return  # after the end the step times predict: wait for the learners
            heapq.heappop(self.timers)
            t, self.kind = self._now(t), kind
            if kind == ASK:
                self.books.syncer(t, ASK, "ask", p)
                self._act(self.state.ask(p, t), t)
            elif kind == DEADLINE:
                self._act(self.state.deadline(p, data, t), t)
            elif kind == PUBLISH:
                self._published(data, t)
            else:
                self._arrived(p, *data, t)
        self.decided = max(self.decided, (to, before))

    def next_merge(self) -> Merge | None:
        """The next closed sync to merge; `merged` it when done."""
        if not self.merges:
            return None
        self.merging += 1
        return self.merges.pop(0)

    @property
    def busy(self) -> bool:
        """A merge is queued or being computed."""
        return bool(self.merges) or self.merging > 0

    def merge(self, job: Merge):
        """The merge of a closed sync, or of the flush (no lock needed: fragment p has one
        version in flight); hand its result to `merged`."""
        return self.theta.merge(job.p, job.weights, job.payloads, job.flush)

    def merged(self, job: Merge, result) -> None:
        """The merge is computed: Θ_p is the new one, and every learner told of it gets its reply
        (the publish notice went at the close, or at its rejoin)."""
        diag = self.theta.take(job.p, result)
        job.result, job.reply = (result[0], diag), result[3]
        if job.flush:
            return
        self.merging -= 1
        for m, life in job.told.items():
            if life == self.roster.life[m]:
                self.roster.send(m, ("reply", job.p, job.n), job.reply)

    def flushes(self) -> list | None:
        """At the end (every learner up has stopped; call again until it says otherwise): the
        fragments to flush and the learners whose Δ each takes (`Merge` jobs without payloads
        yet); None while a merge is left to compute or publish."""
        if self.end is None:
            return None
        self.advance(math.inf)
        if self.busy or any(kind == PUBLISH for _, kind, *_ in self.timers):
            return None
        self.flushing = True
        self.rec, self.rows, self.losses, self.log = self.books.book(self.end)
        t = max([self.end] + [e[0] for e in self.log if e[1] == "merge"])
        for m, (_, held) in self.roster.final.items():
            for p, v in enumerate(held):
                if self.up[m] and v == self.state.version[p]:
                    self.state.applied(m, p, t)
        self.done = t
        return [Merge(p, -1, who, (), 0.0, {}, flush=True)
                for p, who in flush_weights(self.state.end(t), self.rec.since, self.tokens)]

    def flush(self, job: Merge) -> None:
        """The flush of `job` (its payloads in), merged and booked."""
        self.merged(job, self.merge(job))
        book_flush(self.rec, job.p, job.weights, self.done)
        self.flushed.append((job.p, *job.result))

    def result(self) -> dict:
        """The history rows (stats, diagnostics, Θ), the losses, the log and the recorded plan."""
        if self.done is None:
            raise RuntimeError("result() before the flush is planned (a merge is left, or the "
                               "learners have not all stopped): call flushes() until it plans")
        last = self.books.last_row(self.rec, self.done, self.flushed)
        rows = [{**r, "params": self._leaves(r.pop("fragments"))} for r in self.rows + [last]]
        return dict(rows=rows, losses=self.losses, log=sorted(self.log, key=lambda e: e[0]),
                    plan=self.rec.finish(), params=self.theta.params())

    def status(self) -> dict:
        return dict(processed=self.roster.processed(self.up, self.clock), ending=self.end,
                    up=list(self.up), merging=self.busy, stop=list(self.roster.stop))

    # ---- helpers --------------------------------------------------------------------------------
    def _act(self, actions: list, t: float) -> list:
        """Carry out the syncer's actions: timers, the asks' numbers, closes; returns the asks
        of a returning learner."""
        again = []
        for a in actions:
            match a:
                case AskAt(p, when):
                    heapq.heappush(self.timers, (when, ASK, next(self.seq), p, None))
                case Ask(p, sync, _) if self.open[p] is None:
                    self.open[p], self.payloads[p] = (sync, self.asked_n[p]), {}
                    self.asked_n[p] += 1
                case Ask(p, _, _):
                    again.append(("ask", t, p, self.open[p][1]))
                case SetDeadline(p, sync, when):
                    heapq.heappush(self.timers, (when, DEADLINE, next(self.seq), p, sync))
                case Close(p, _, weights, _, _, wait_s):
                    to = tuple(m for m in range(self.M) if self.up[m])
                    at = max(self.links.fan_out(to, self.down_nbytes[p], t), default=t)
                    n = self.open[p][1]
                    answers = {m: self.payloads[p][m] for m in weights}
                    job = Merge(p, n, weights, to, wait_s, answers, closed_at=t,
                                published_at=at, next_ask=self.state.next_ask(p, at))
                    self.open[p] = None
                    self.merges.append(job)
                    heapq.heappush(self.timers, (at, PUBLISH, next(self.seq), p, job))
                    for m in to:  # the notice now, the reply once merged
                        self.roster.send(m, self._notice(m, job))
                        job.told[m] = self.roster.life[m]
                    self.books.syncer(t, self.kind, "close", p, n, weights)
        return again

    def _arrived(self, p: int, m: int, n: int, since: int, sent_at: float, payload, t) -> None:
        """An answer reached the syncer (one to a sync already closed, or of a learner down
        since, is left out: `actors.booking` books it so)."""
        o = self.open[p]
        if o is None or o[1] != n or not self.up[m]:
            return
        self._act(self.state.sent(p, m, o[0], since * self.tokens, since, sent_at), t)
        if self.state.holds(p, m, o[0]):
            self.payloads[p][m] = payload
        self._act(self.state.arrived(p, m, o[0], t), t)

    def _published(self, job: Merge, t: float) -> None:
        actions = self.state.published(job.p, t)
        assert actions == [AskAt(job.p, job.next_ask)], (actions, job.next_ask)
        self._act(actions, t)
        leaves, diag = job.result
        self.versions[job.p].append((t, leaves))
        self.books.syncer(t, PUBLISH, "publish", job.p, job.weights, job.receivers, job.wait_s,
                          leaves, diag)

    def _notice(self, m: int, job: Merge) -> tuple:
        return ("publish", job.published_at, job.p, job.n, m in job.weights, job.next_ask)

    def _reload(self, m: int, now: float) -> None:
        """Returning learner m reloads: from a peer's next step boundary, or at once (fresh)."""
        peer = peer_of(self.up, m)
        if peer == FRESH:  # no peer up: a fresh inner optimizer state (its own was lost)
            self._back(m, FRESH, None, now)
        else:
            self.peer_of[m] = peer
            self.outbox.append((peer, ("upload", m), None, self.roster.life[peer], None))

    def _back(self, m: int, peer: int, inner_state, t: float) -> None:
        t = self._now(t)
        self.books.syncer(t, REJOIN, "reload", m, peer)
        asks = self._act(self.state.back(m, t), t)  # the open syncs it had not answered
        asks += [("ask", when, p, self.asked_n[p]) for when, kind, _, p, _ in self.timers
                 if kind == ASK]  # the asks to come (those after a merge in flight: with it)
        flying = [job for _, kind, _, _, job in sorted(self.timers) if kind == PUBLISH]
        held = [max(i for i, (at, _) in enumerate(v) if at <= t) for v in self.versions]
        fragments = [self.versions[p][i][1] for p, i in enumerate(held)]
        k = self.roster.last[m][0]
        messages = self.roster.started(m, asks + [self._notice(m, job) for job in flying], k,
                                       held, t, now=self.clock)
        for job in flying:  # a merge in flight: its notice now (above), its reply once merged
            job.told[m] = self.roster.life[m]
            if job.reply is not None:
                self.roster.send(m, ("reply", job.p, job.n), job.reply)
        self.rejoined[m] = dict(leaves=self._leaves(fragments), inner=inner_state, k=k, t=t,
                                messages=messages, versions=held, life=self.roster.life[m])

    def _check_end(self) -> None:
        if self.end is None:
            self.end = self.roster.end(self.up)
            if self.end is not None:
                self._by_the_end()

    def _by_the_end(self) -> None:
        """An answer that arrived after the end, but that the clock's link would have carried by
        then (sent by the end: on loopback's free link, at once), counts as arrived then."""
        link = self.timeline.cluster.link
        for i, (t, kind, seq, p, data) in enumerate(self.timers):
            if kind == RESPONSE and t > self.end:
                sent = data[3] + link.busy_s(self.theta.nbytes(p)) + link.latency_s
                if sent <= self.end:
                    self.timers[i] = (sent, kind, seq, p, data)
        heapq.heapify(self.timers)

    def _send_back(self, p: int, t: float) -> float:
        to = [m for m in range(self.M) if self.up[m]]
        return max(self.links.fan_out(to, self.down_nbytes[p], t, book=False), default=t) - t

    def _leaves(self, fragments: list) -> list:
        out = [None] * sum(len(f) for f in self.theta.frags)
        for idx, leaves in zip(self.theta.frags, fragments, strict=True):
            for i, x in zip(idx, leaves, strict=True):
                out[i] = x
        return out

    def _now(self, t: float) -> float:
        self.clock = max(self.clock, t)
        return self.clock
