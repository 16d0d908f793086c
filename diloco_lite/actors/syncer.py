"""Decoupled DiLoCo's syncer on the wall clock: the state machine, driven by real events.

`SyncerRuntime` is the real runtime's twin of `clock.syncer.plan_decoupled`: the same
`SyncerState` decides (quorum, grace, token weights, failures, the flush), the same
`LearnerRules` say when a learner answers and applies, what a rejoin loads and how the flush
weighs (`clock.learner_rules`), and the same `Recorder` books bytes, steps and goodput. What
differs is where the events come from: real learners, each in its own process, call in at
every step boundary, and the times are seconds of wall clock since the run's start `t0`.

A learner's step boundary is one short call (`boundary`): it reports its step (and the loss)
stamped with its own clock (its step times padded to `Cluster.step_time_s`), and the reply says
what to do now: answer these asks (Δ through the wire format, sent back by `answered`), apply
these published fragments, upload its inner optimizer state for a returning peer, or stop. The
syncer's own events (the asks of the schedule, the grace deadlines, and the answers, each
stamped with the time it reached the syncer) are handled in order of time `hold_s` after it,
so that a learner's report stamped earlier and still on its way is handled first: at equal
times the order is the simulated clock's (an ask reaches a learner that finishes a step at that
very time; an answer that arrives after a grace deadline is too late, whichever thread sees it
first). A merge is computed off the lock (`next_merge`/`merge`/`publish`): learners keep
calling in meanwhile. On loopback a published fragment is picked up by each learner at its next
boundary: publishing is the end of the merge. (One difference at equal times: the simulated
clock lets a learner apply, at its step boundary, a merge published at that very instant, on a
free link even one its own answer of that boundary closed; here a learner hears of a merge at
its first boundary after the publish.)

The end: once the budget is spent, the learners stop; an answer sent by then counts as arrived
at the end (on loopback's free link it arrived when sent), one sent later is left out.
`flushes()` runs what was due by the end and plans the flush once no merge is left to compute
or publish (else it returns None: call it again); from then on no answer is taken, so no merge
can start beside the flush. A returning learner's `rejoin` gives a ticket, which a later
failure or rejoin of the same learner voids (`take_rejoin`): a process that died while waiting
never takes what is meant for the next one.

Θ, the outer optimizer's states and the merges' numbers are `actors.theta.SyncerParams`'s.
Everything the syncer records also makes a `Plan` (`result()["plan"]`): the real run's events,
which the lock-step replay (`training.train(config, plan=...)`) turns into the same parameters.
Nothing here imports Ray; `actors.runtime` calls these methods from Ray's threads, under a lock.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import numpy as np

from ..clock import Timeline
from ..clock.learner_rules import FRESH, LearnerRules
from ..clock.recorder import Recorder
from ..clock.schedule import Schedule
from ..clock.syncer import ASK, BOUNDARY, DEADLINE, END, FAIL, RESPONSE  # at equal times
from ..clock.syncer_state import AskAt, Close, SetDeadline, SyncerState
from ..training import eval_points
from ..validate import check_nonnegative
from .theta import SyncerParams


@dataclasses.dataclass
class Reply:
    """What a learner does at its step boundary, in this order."""

    stop: bool = False  # the budget is spent: undo the step just taken and stop
    answer: list = dataclasses.field(default_factory=list)  # [(fragment, sync)]: send Δ
    apply: list = dataclasses.field(default_factory=list)  # [(fragment, Θ_p leaves)]
    upload: bool = False  # send the inner optimizer state (a returning peer loads it)
    fetch: list = dataclasses.field(default_factory=list)  # fragments published since its last
    # boundary: a runtime starts fetching them now, so that they are there when due


@dataclasses.dataclass
class Merge:
    p: int
    weights: dict  # learner -> weight
    receivers: tuple  # the learners up at the close: one reply each
    wait_s: float
    payloads: dict  # learner -> bytes
    flush: bool = False
    closed_at: float = 0.0  # the close's time (the flush: 0)


class SyncerRuntime:
    """The syncer of `config` (Decoupled DiLoCo) from `params` (None: the model's initial
    parameters for `config.seed`; module docstring)."""

    def __init__(self, config, params=None, hold_s: float = 0.01):
        check_nonnegative("hold_s", hold_s)
        algo = config.algorithm
        self.theta = theta = SyncerParams(config, params)  # Θ, the outer states, the merges
        d = theta.driver
        self.M, self.P, self.steps, self.hold = config.workers, len(d.frags), config.steps, hold_s
        tokens = config.batch_size * config.seq_len
        self.timeline = Timeline(config.cluster, self.M)
        self.rec = Recorder(self.timeline, up_nbytes=d.up_nbytes, down_nbytes=d.down_nbytes,
                            sizes=d.sizes, rejoin_nbytes=d.rejoin_nbytes,
                            tokens_per_step=tokens, mix=d.alpha)
        self.state = SyncerState(algo, self.M, self.timeline.t_ref)  # loopback: a free link
        self.rules = LearnerRules(self.state, self.rec, tau=Schedule.of(algo).overlap,
                                  tokens_per_step=tokens, on_action=self._on_action)
        M, P = self.M, self.P
        self.fresh = [set() for _ in range(M)]  # fragments published since m's last boundary
        self.payloads = [{} for _ in range(P)]  # fragment -> learner -> its last answer
        self.timers, self.seq, self.clock = [], itertools.count(), 0.0
        self.merges: list[Merge] = []  # closed, to compute
        self.merging = 0  # merges handed out (`next_merge`), not published yet
        self.flushing = False  # the flush is planned: no answer is taken any more
        self.evals = sorted(e for e in eval_points(config) if e < config.steps)
        self.rows, self.diags, self.losses, self.log = [], [], [], []
        self.peer_of: dict = {}  # returning learner -> the peer asked for its inner state
        self.rejoined: dict = {}  # returning learner -> (Θ leaves, inner state, k, t)
        self.tickets = [0] * M  # each learner's current rejoin ticket (`rejoin`)
        self.ending: float | None = None  # the time the budget was spent

    # ---- the learners' calls --------------------------------------------------------------------
    @property
    def up(self) -> list[bool]:
        return self.state.up

    def start(self) -> None:
        self.rules.start()

    def boundary(self, m: int, T: float, loss: float) -> Reply:
        """Learner m finished a step at T on its clock (module docstring)."""
        if self.ending is not None or not self.up[m]:
            return Reply(stop=True)  # finished after the budget ran out: not counted
        self.advance(T, before=BOUNDARY)
        t = self._now(T)
        rec = self.rec
        self.losses.append((m, t, loss))
        reply = Reply(answer=self.rules.boundary(m, t))
        self.log += [(t, "answer", m, p) for p, _ in reply.answer]
        for p in self.rules.apply(m, t):
            reply.apply.append((p, self.theta.fragment(p)))
            self.log.append((t, "apply", m, p))
        while self.evals and rec.c["processed"] >= self.evals[0] * self.M:
            self._eval(self.evals.pop(0), t)
        if rec.c["processed"] == self.M * self.steps:
            self.ending = t
        reply.upload = m in self.peer_of.values()
        reply.fetch, self.fresh[m] = sorted(self.fresh[m]), set()
        return reply

    def answered(self, m: int, p: int, sync: int, payload: np.ndarray, sent_at: float,
                 now: float) -> None:
        """Learner m's answer to sync `sync` of fragment p, sent at its boundary `sent_at`,
        reached the syncer at `now`: an event at `now`, in order with the timers (module
        docstring: the end's rule, none once the flush is planned)."""
        if self.flushing or not self.up[m]:
            return  # too late for anything but the flush, or it failed since it sent it
        if self.ending is not None and now > self.ending:
            if sent_at > self.ending:
                return  # sent after the budget ran out: left out
            now = self.ending
        heapq.heappush(self.timers, (now, RESPONSE, next(self.seq), p, (m, sync, payload)))
        self.advance(now - self.hold, before=RESPONSE + 1)

    def failed(self, m: int, now: float) -> None:
        """Learner m's process died: its unsynced work and its answers on the wire are lost; a
        rejoin it was waiting for is void. (Already down: only that.)"""
        self.tickets[m] += 1
        self.peer_of.pop(m, None)
        self.rejoined.pop(m, None)
        if not self.up[m]:
            return
        if self.ending is None:
            self.advance(now - self.hold, before=FAIL)
            t = self._now(now)
        else:  # heard of after the end: as at the end (out of the flush)
            t = self.clock
        self.log.append((t, "fail", m, -1))
        self.rules.failed(m, t)
        for r, q in list(self.peer_of.items()):
            if q == m:  # it was to send its state to a returning learner: ask another one
                del self.peer_of[r]
                self._reload(r, now)

    def killed(self, m: int, now: float) -> None:
        """The driver killed learner m's process (a failure window began): logged, up or not."""
        self.log.append((now, "kill", m, -1))

    def rejoin(self, m: int, now: float) -> int:
        """Learner m is back: it reloads at the next step boundary of a healthy peer, which
        uploads its inner optimizer state (`peer_state`); with no peer up, at once, with a fresh
        one. Returns its ticket for `take_rejoin`."""
        self.tickets[m] += 1
        self.rejoined.pop(m, None)
        self._reload(m, now)
        return self.tickets[m]

    def take_rejoin(self, m: int, ticket: int) -> tuple[str, tuple | None]:
        """("ready", (Θ leaves, inner state, k, t)) once learner m's rejoin `ticket` has its
        state, ("wait", None) before, ("gone", None) when the ticket is void (m failed again or
        rejoined anew) or the run has ended."""
        if ticket != self.tickets[m]:
            return "gone", None
        if m in self.rejoined:
            return "ready", self.rejoined.pop(m)
        if self.ending is not None:
            self.peer_of.pop(m, None)
            return "gone", None
        return "wait", None

    def peer_state(self, q: int, inner_state, now: float) -> None:
        """Peer q's inner optimizer state, uploaded at its step boundary."""
        for m in [r for r, peer in self.peer_of.items() if peer == q]:
            del self.peer_of[m]
            self._back(m, q, inner_state, now)

    # ---- the syncer's own work ------------------------------------------------------------------
    def advance(self, to: float, before: int = 99) -> None:
        """Handle the events due before (to, before) in order of time: asks, arrivals and
        deadlines (none after the end)."""
        while self.timers and self.timers[0][:2] < (to, before) and (
                self.ending is None or self.timers[0][0] <= self.ending):
            when, kind, _, p, data = heapq.heappop(self.timers)
            t = self._now(when)
            if kind == ASK:
                self.log.append((t, "ask", -1, p))
                self.rules.ask(p, t)
            elif kind == DEADLINE:
                self.rules.deadline(p, data, t)
            elif self.up[data[0]]:  # an answer (its learner failed since: left out)
                m, sync, payload = data
                self.payloads[p][m] = (sync, payload)
                self.rules.arrived(p, m, sync, t)

    def next_merge(self) -> Merge | None:
        """The next closed sync to merge; `publish` it when done."""
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
        version in flight); `publish` its result."""
        return self.theta.merge(job.p, job.weights, job.payloads, job.flush)

    def publish(self, job: Merge, result, now: float) -> None:
        """The merged fragment is in: every up learner applies it τ of its own steps after its
        first boundary since the ask that came while the sync was open (else its next one)."""
        p = job.p
        self.diags.append((p, job.flush, self.theta.take(p, result)))
        t = self.clock if job.flush else self._now(now)  # the flush: at the end's time
        self.log.append((t, "merge", -1, p))
        if job.flush:
            self.rules.flushed(p, job.weights, t)
            return
        self.merging -= 1
        for m in self.rules.published(p, job.weights, t, receivers=job.receivers,
                                      wait_s=job.wait_s):
            self.fresh[m].add(p)

    def flushes(self) -> list | None:
        """At the end (the learners stopped, every answer they sent has arrived): what was due
        by the end runs; then, with no merge left to compute or publish, the fragments to flush
        and the learners whose Δ each takes (`Merge` jobs without payloads yet), and no answer
        is taken any more; None while a merge is left (call again once it is published). The
        time of the end is the budget's, or the last publish after it (as on the simulated
        clock)."""
        if self.ending is None:
            raise RuntimeError("flushes() before the end: the budget is not spent")
        self.advance(self.ending, before=END)
        if self.busy:
            return None
        self.flushing = True
        return [Merge(p, who, (), 0.0, {}, flush=True)
                for p, who in self.rules.flushes(self.clock)]

    def result(self) -> dict:
        """The last row, the rows' stats and parameters, the losses and the recorded plan."""
        if self.busy:
            raise RuntimeError("result() while a merge is queued or being computed")
        processed = self.rec.c["processed"]
        complete = processed == self.M * self.steps
        self._eval(min(self.steps, processed / self.M), self.clock, last=True,
                   complete=complete)
        return dict(rows=self.rows, losses=self.losses, log=self.log, plan=self.rec.finish(),
                    params=self.theta.params())

    def status(self) -> dict:
        return dict(processed=self.rec.c["processed"], ending=self.ending, up=list(self.up),
                    merging=self.busy)

    # ---- helpers --------------------------------------------------------------------------------
    def _on_action(self, a, t: float) -> None:
        """The syncer's timers go on `timers`; a close queues its merge."""
        match a:
            case AskAt(p, when):
                heapq.heappush(self.timers, (when, ASK, next(self.seq), p, -1))
            case SetDeadline(p, sync, when):
                heapq.heappush(self.timers, (when, DEADLINE, next(self.seq), p, sync))
            case Close(p, sync, weights, _, _, wait_s):
                receivers = tuple(m for m in range(self.M) if self.up[m])
                payloads = {}
                for m in weights:
                    answered, payloads[m] = self.payloads[p][m]
                    assert answered == sync, (p, m, answered, sync)
                self.merges.append(Merge(p, weights, receivers, wait_s, payloads,
                                         closed_at=t))
                self.log.append((t, "close", -1, p))

    def _reload(self, m: int, now: float) -> None:
        """Returning learner m reloads: from a peer's next step boundary, or at once (fresh)."""
        peer = self.rules.peer(m)
        if peer == FRESH:  # no peer up: a fresh inner optimizer state (its own was lost)
            self._back(m, FRESH, None, now)
        else:
            self.peer_of[m] = peer

    def _back(self, m: int, peer: int, inner_state, now: float) -> None:
        t = self._now(now)
        self.rules.back(m, peer, t)  # asked again by the open syncs it had not answered
        self.rejoined[m] = (self.theta.leaves(), inner_state, self.rules.k[m], t)
        self.log.append((t, "rejoin", m, -1))

    def _eval(self, progress: float, t: float, **kw) -> None:
        self.rec.eval(progress, t, **kw)
        self.rows.append(dict(stats=self.rec.events[-1].stats, diags=self.diags,
                              params=self.theta.leaves()))
        self.diags = []

    def _now(self, t: float) -> float:
        self.clock = max(self.clock, t)
        return self.clock
