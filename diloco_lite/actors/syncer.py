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
syncer's own timers (the asks of the schedule, the grace deadlines) fire `hold_s` after their
time, so that a learner's report stamped earlier and still on its way is handled first: at
equal times the order is the simulated clock's (an ask reaches a learner that finishes a step
at that very time). A merge is computed off the lock (`next_merge`/`merge`/`publish`): learners
keep calling in meanwhile. On loopback a published fragment is picked up by each learner at its
next boundary: publishing is the end of the merge.

Everything the syncer records also makes a `Plan` (`result()["plan"]`): the real run's events,
which the lock-step replay (`training.train(config, plan=...)`) turns into the same parameters.
Nothing here imports Ray; `actors.runtime` calls these methods from Ray's threads, under a lock.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..algorithms.learners import LearnersDriver, merge_step
from ..clock import Timeline
from ..clock.learner_rules import FRESH, LearnerRules
from ..clock.recorder import Recorder
from ..clock.schedule import Schedule
from ..clock.syncer import ASK, BOUNDARY, DEADLINE, FAIL, RESPONSE  # the order at equal times
from ..clock.syncer_state import AskAt, Close, SetDeadline, SyncerState
from ..outer import take_leaves
from ..training import eval_points, setup
from ..wire import from_bytes


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
    receivers: int
    wait_s: float
    payloads: dict  # learner -> bytes
    flush: bool = False


class SyncerRuntime:
    """The syncer of `config` (Decoupled DiLoCo) from `params` (None: the model's initial
    parameters for `config.seed`; module docstring)."""

    def __init__(self, config, params=None, hold_s: float = 0.01):
        algo = config.algorithm
        _, model, mesh, optimizer = setup(config, workers=1)
        params = params if params is not None else model.init(config.seed)
        d = LearnersDriver(config, model, mesh, optimizer, params)
        self.frags, self.mean_leaves, self.rda = d.frags, d.mean_leaves, d.rda
        self.M, self.P, self.steps, self.hold = config.workers, len(d.frags), config.steps, hold_s
        tokens = config.batch_size * config.seq_len
        self.timeline = Timeline(config.cluster, self.M)
        self.rec = Recorder(self.timeline, up_nbytes=d.up_nbytes, down_nbytes=d.down_nbytes,
                            sizes=d.sizes, rejoin_nbytes=d.rejoin_nbytes,
                            tokens_per_step=tokens, mix=d.alpha)
        self.state = SyncerState(algo, self.M, self.timeline.t_ref)  # loopback: a free link
        self.rules = LearnerRules(self.state, self.rec, tau=Schedule.of(algo).overlap,
                                  tokens_per_step=tokens, on_action=self._on_action)
        self.treedef = jax.tree.structure(params)
        self.global_ = [jnp.asarray(x) for x in jax.tree.leaves(params)]
        frags = [take_leaves(self.global_, f) for f in self.frags]
        self.outer = [d.outer_optimizer.init(f) for f in frags]
        self.like = [jax.tree.map(lambda s: jax.ShapeDtypeStruct((1,) + s.shape, s.dtype),
                                  jax.eval_shape(lambda f: [d.up.encode(x) for x in f], f))
                     for f in frags]
        self._merge = jax.jit(functools.partial(merge_step, d.outer_optimizer, d.up, d.down),
                              static_argnames=("mean_leaves", "rda", "flush"))
        M, P = self.M, self.P
        self.fresh = [set() for _ in range(M)]  # fragments published since m's last boundary
        self.payloads = [{} for _ in range(P)]  # fragment -> learner -> its last answer
        self.timers, self.seq, self.clock = [], itertools.count(), 0.0
        self.merges: list[Merge] = []  # closed, to compute
        self.evals = sorted(e for e in eval_points(config) if e < config.steps)
        self.rows, self.diags, self.losses, self.log = [], [], [], []
        self.peer_of: dict = {}  # returning learner -> the peer asked for its inner state
        self.rejoined: dict = {}  # returning learner -> (Θ leaves, inner state, k, t)
        self.ending: float | None = None  # the time the budget was spent
        for p, f in enumerate(frags):  # compile the merges before the clock starts
            for flush in (False, True):
                self._merge(f, self.outer[p], self._stack(p, {}), jnp.zeros(M),
                            mean_leaves=self.mean_leaves[p], rda=self.rda, flush=flush)

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
            reply.apply.append((p, [np.asarray(x) for x in take_leaves(self.global_,
                                                                       self.frags[p])]))
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
        """Learner m's answer to sync `sync` of fragment p, sent at its boundary `sent_at`, has
        arrived. One sent after the budget ran out is left out; one sent at that very instant
        is not (the simulated clock's order: a free link delivers it at once)."""
        self.advance(now - self.hold, before=RESPONSE)
        if (self.ending is not None and sent_at > self.ending) or not self.up[m]:
            return  # after the end, or it failed since it sent it: left out
        t = self._now(now)
        self.payloads[p][m] = payload
        self.rules.arrived(p, m, sync, t)

    def failed(self, m: int, now: float) -> None:
        """Learner m's process died: its unsynced work and its answers on the wire are lost."""
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
                self.rejoin(r, now)

    def rejoin(self, m: int, now: float) -> None:
        """Learner m is back: it reloads at the next step boundary of a healthy peer, which
        uploads its inner optimizer state (`peer_state`); with no peer up, at once, with a fresh
        one. `rejoined.get(m)` then holds what it loads."""
        peer = self.rules.peer(m)
        if peer == FRESH:  # no peer up: a fresh inner optimizer state (its own was lost)
            self._back(m, FRESH, None, now)
        else:
            self.peer_of[m] = peer

    def peer_state(self, q: int, inner_state, now: float) -> None:
        """Peer q's inner optimizer state, uploaded at its step boundary."""
        for m in [r for r, peer in self.peer_of.items() if peer == q]:
            del self.peer_of[m]
            self._back(m, q, inner_state, now)

    # ---- the syncer's own work ------------------------------------------------------------------
    def advance(self, to: float, before: int = 99) -> None:
        """Run the timers due before (to, before): asks and deadlines, in order of time."""
        while self.timers and self.timers[0][:2] < (to, before) and (
                self.ending is None or self.timers[0][0] <= self.ending):
            when, kind, _, p, sync = heapq.heappop(self.timers)
            t = self._now(when)
            if kind == ASK:
                self.log.append((t, "ask", -1, p))
                self.rules.ask(p, t)
            else:
                self.rules.deadline(p, sync, t)

    def next_merge(self) -> Merge | None:
        return self.merges.pop(0) if self.merges else None

    def merge(self, job: Merge):
        """The merge of a closed sync (no lock needed: fragment p has one version in flight)."""
        p = job.p
        w = np.zeros(self.M, np.float32)
        for m, x in job.weights.items():
            w[m] = x
        new, outer, diag = self._merge(take_leaves(self.global_, self.frags[p]), self.outer[p],
                                       self._stack(p, job.payloads), jnp.asarray(w),
                                       mean_leaves=self.mean_leaves[p], rda=self.rda,
                                       flush=job.flush)
        return jax.block_until_ready((new, outer, diag))

    def publish(self, job: Merge, result, now: float) -> None:
        """The merged fragment is in: every up learner applies it τ of its own steps after its
        first boundary since the ask that came while the sync was open (else its next one)."""
        p, (new, outer, diag) = job.p, result
        for i, x in zip(self.frags[p], new, strict=True):
            self.global_[i] = x
        self.outer[p] = outer
        self.diags.append((p, job.flush, np.asarray(diag)))
        t = self.clock if job.flush else self._now(now)  # the flush: at the end's time
        self.log.append((t, "merge", -1, p))
        if job.flush:
            self.rules.flushed(p, job.weights, t)
            return
        for m in self.rules.published(p, job.weights, t, receivers=job.receivers,
                                      wait_s=job.wait_s):
            self.fresh[m].add(p)

    def flushes(self) -> list:
        """At the end (the learners stopped, every merge published): the fragments to flush and
        the learners whose Δ each takes (`Merge` jobs without payloads yet). The time of the
        end is the budget's, or the last publish after it (as on the simulated clock)."""
        return [Merge(p, who, 0, 0.0, {}, flush=True)
                for p, who in self.rules.flushes(self.clock)]

    def result(self) -> dict:
        """The last row, the rows' stats and parameters, the losses and the recorded plan."""
        processed = self.rec.c["processed"]
        complete = processed == self.M * self.steps
        self._eval(min(self.steps, processed / self.M), self.clock, last=True,
                   complete=complete)
        return dict(rows=self.rows, losses=self.losses, log=self.log, plan=self.rec.finish(),
                    params=jax.tree.unflatten(self.treedef, [np.asarray(x)
                                                             for x in self.global_]))

    def status(self) -> dict:
        return dict(processed=self.rec.c["processed"], ending=self.ending, up=list(self.up),
                    merging=bool(self.merges))

    # ---- helpers --------------------------------------------------------------------------------
    def _on_action(self, a, t: float) -> None:
        """The syncer's timers go on `timers`; a close queues its merge."""
        match a:
            case AskAt(p, when):
                heapq.heappush(self.timers, (when, ASK, next(self.seq), p, -1))
            case SetDeadline(p, sync, when):
                heapq.heappush(self.timers, (when, DEADLINE, next(self.seq), p, sync))
            case Close(p, _, weights, _, receivers, wait_s):
                payloads = {m: self.payloads[p][m] for m in weights}
                self.merges.append(Merge(p, weights, receivers, wait_s, payloads))
                self.log.append((t, "close", -1, p))

    def _back(self, m: int, peer: int, inner_state, now: float) -> None:
        t = self._now(now)
        self.rules.back(m, peer, t)  # asked again by the open syncs it had not answered
        self.rejoined[m] = ([np.asarray(x) for x in self.global_], inner_state,
                            self.rules.k[m], t)
        self.log.append((t, "rejoin", m, -1))

    def _eval(self, progress: float, t: float, **kw) -> None:
        self.rec.eval(progress, t, **kw)
        self.rows.append(dict(stats=self.rec.events[-1].stats, diags=self.diags,
                              params=[np.asarray(x) for x in self.global_]))
        self.diags = []

    def _stack(self, p: int, payloads: dict):
        """The M learners' payloads of fragment p, stacked (zeros where none: weight 0)."""
        n = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(self.like[p]))
        buf = np.zeros((self.M, n), np.uint8)
        for m, b in payloads.items():
            buf[m] = b
        return from_bytes(jnp.asarray(buf), self.like[p])

    def _now(self, t: float) -> float:
        self.clock = max(self.clock, t)
        return self.clock
