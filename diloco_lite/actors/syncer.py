"""Decoupled DiLoCo's syncer on the wall clock: the state machine, driven by real events.

`SyncerRuntime` is the real runtime's twin of `clock.syncer.plan_decoupled`: the same
`SyncerState` decides (quorum, grace, token weights, failures, the flush) and the same link
model (`clock.Links`) says when a reply reaches the learners; the learners' own rules run on
the learners (`actors.agent`). Times are seconds of wall clock since the run's start `t0`.
Its parts: this module (the messages and the syncer's own events), `actors.merging` (the
merges, computed off the lock, and the end), `actors.rejoins` (failures and rejoins),
`actors.roster` (where the learners are between their reports), `actors.booking` (the books).

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
`until` says it has a step boundary after it (then the run ends no earlier). Nothing here
imports Ray; `actors.ray_actors` calls these methods from Ray's threads, under a lock.
"""

from __future__ import annotations

import heapq
import itertools

from ..clock import Links, Timeline
from ..clock.recorder import Recorder
from ..clock.syncer import ASK, DEADLINE, END, FAIL, PUBLISH, RESPONSE
from ..clock.syncer_state import Ask, AskAt, Close, SetDeadline, SyncerState
from ..training import eval_points
from ..validate import check_nonnegative
from .booking import Books
from .merging import Merge, Merges
from .rejoins import Rejoins
from .roster import Roster
from .theta import SyncerParams

__all__ = ["Merge", "SyncerRuntime"]


class SyncerRuntime(Rejoins, Merges):
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
        self.state = SyncerState(config.algorithm, self.M, t.t_ref, reply_s=self._reply_s)
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

    def until(self, m: int, life: int, t: float) -> int | None:
        """Learner m is at its step boundary at t, unsure of what it does there
        (`LearnerAgent.unsure`): once every event up to that instant is handled, the number of
        messages its process has been sent (it waits for them all); None before. (A step
        boundary before its stop: the run ends no earlier.)"""
        if life != self.roster.life[m] or not self.up[m]:
            return 0  # a process the syncer holds as gone: nothing to wait for
        if self.end is not None:
            return len(self.roster.heard[m])  # (no event left to handle)
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
            # a publish counts from the time its notice gave the learners (they apply on it),
            # even when its merge was computed later than that
            clock = self._now(t)
            t, self.kind = (t if kind == PUBLISH else clock), kind
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

    def _reply_s(self, p: int, t: float) -> float:  # t_reply: the merged fragment to all up
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
