"""Decoupled DiLoCo as a discrete-event program, written in five layers, each one idea more.

No barrier: each learner steps at its own pace on one simulated clock and never waits. A syncer
owns the global fragments Θ_p. Notebook 04 builds the same five layers in its own cells:

1. `Core`: learners that never wait. For each fragment, on Streaming DiLoCo's schedule (every H
   reference steps of t_ref seconds, the median learner's step), the syncer **asks** every
   learner; each **answers** at its next step boundary with Δ = base − θ (base: the Θ_p it last
   took); once every answer is in, the syncer **merges** them (the plain mean), takes the
   **outer Nesterov step** on Θ_p and **publishes** it; each learner **applies** it τ of its own
   steps after the ask: θ ← αθ + (1−α)Θ_p, base ← Θ_p. At the end, what is in flight is
   published and each fragment's remaining work is averaged in once (no outer step).
2. `Quorum`: the syncer closes once K answers are in (the **quorum**) and a **grace window**
   has passed: the slack left before the learners need the result τ reference steps after the
   ask, times a safety factor; it closes at once when no learner is still awaited.
3. `Weighted`: each answer counts with its **token weight** tokens · (tokens / steps) (with
   equal batches, proportional to its steps); fragments are merged by **Radial-Directional
   Averaging** (the embeddings by the weighted mean).
4. `Failures`: a learner fails at the times of `Cluster.failures`: it loses its state and its
   unmerged work, and the syncer leaves it out (weight 0, out of the quorum). Back, it loads Θ
   and a healthy peer's optimizer state (a fresh one if no peer is up) and answers the syncs
   still open.
5. `Run` (what `decoupled` runs): finite links and b bits. Answers travel in `bits` from the
   learner's host to the syncer's, the new Θ_p in `down_bits` to each learner up, one copy after
   the other; every host's link sends and receives first in, first out. A merge is published
   when its last copy has arrived, which also tells the learners the sync is closed: an answer
   sent before then is booked but left out.

Each layer refuses, with a `ValueError` naming the field, the settings it does not model (a
quorum below M before layer 2, RDA before layer 3, failures before layer 4, a finite link or
fewer bits before layer 5; a custom outer optimizer or layer fragmentation in every layer).
Events are `(time, kind, sequence, data)` on one heap: at equal times the kinds run in the
order below, and events of one kind in the order they were pushed.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

from ..clock import Cluster, Timeline
from ..validate import check
from .common import balanced_fragments as fragments
from .common import (
    first_send,
    outer_nesterov,
    payload_bytes,
    quantize,
    setup,
    split_merge,
    weighted_mean,
)

# what can happen, in the order it happens at equal times
ASK, BOUNDARY, ARRIVE, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN = range(8)
HANDLERS = ("ask", "boundary", "arrive", "deadline", "publish", "apply", "fail", "rejoin")


@dataclasses.dataclass
class Learner:
    params: list                 # θ_m (a list of arrays, one per tensor)
    opt_state: object            # its inner optimizer's state
    base: list                   # the Θ it last took, tensor by tensor: Δ = base − θ
    since: list                  # per fragment: its steps since that base
    steps: int = 0               # steps taken; also the index of its next batch
    up: bool = True
    failures: int = 0            # failure windows behind it
    asked: dict = dataclasses.field(default_factory=dict)     # fragment -> sync to answer
    ask_step: dict = dataclasses.field(default_factory=dict)  # fragment -> its step at the ask
    due: dict = dataclasses.field(default_factory=dict)  # fragment -> apply the new Θ_p at step
    merged: set = dataclasses.field(default_factory=set)  # fragments whose answer was merged


@dataclasses.dataclass
class Sync:
    """One open sync of one fragment."""

    id: int
    asked_t: float
    unanswered: set              # learners whose answer has not left yet
    answers: dict = dataclasses.field(default_factory=dict)  # learner -> (weight, Δ), sent
    arrived: set = dataclasses.field(default_factory=set)
    quorum_t: float | None = None
    deadline: float = math.inf


def decoupled(config, params=None, log: list | None = None) -> list:
    """Train `config` (a `RunConfig` of `DecoupledDiLoCo()`); return Θ (one array per tensor).
    `log`, a list, receives `(time, what, learner, fragment)` for every step, ask, answer (sent),
    arrive (an answer reaches the syncer, merged or not), close (its learner: the tuple of those
    merged), publish, apply, fail, rejoin and flush (the tuple of learners averaged in)."""
    return Run(config, params, log).run()


class Core:
    """Layer 1: learners that never wait; every answer merged by the plain mean; a free link."""

    def __init__(self, config, params=None, log=None):
        self.refuse(config)
        a = self.algo = config.algorithm
        self.s = s = setup(config, params)
        self.M, self.budget, self.log = config.workers, config.workers * config.steps, log
        self.clock = Timeline(config.cluster, self.M)  # each learner's step times and failures
        self.tokens = config.batch_size * config.seq_len
        self.frags = fragments(s.init, a.fragments)
        self.theta, self.velocity = list(s.init), [0.0 * x for x in s.init]
        self.learners = [Learner(list(s.init), s.optimizer.init(s.init), list(s.init),
                                 [0] * a.fragments) for _ in range(self.M)]
        self.syncs = [None] * a.fragments  # each fragment's open sync
        self.ask_at = [first_send(p, a.inner_steps, a.fragments) for p in range(a.fragments)]
        self.grid, self.taken = [0.0], 0
        self.heap, self.seq, self.ids = [], itertools.count(), itertools.count()

    ADDS = ()  # what a layer models beyond the one it extends

    def refuse(self, config):
        """A ValueError naming each setting this layer does not model."""
        a, c, M = config.algorithm, config.cluster or Cluster(), config.workers
        layer, models = type(self).__name__, {x for k in type(self).__mro__
                                               for x in vars(k).get("ADDS", ())}
        check(a.name == "decoupled_diloco", "RunConfig.algorithm", type(a).__name__,
              "DecoupledDiLoCo()")
        check(a.outer_optimizer is None, "DecoupledDiLoCo.outer_optimizer", "custom",
              "None in the reference (its outer Nesterov step, outer_lr and momentum 0.9)")
        check(a.fragmentation == "balanced", "DecoupledDiLoCo.fragmentation", a.fragmentation,
              "'balanced' in the reference")
        check(a.quorum <= M if "quorum" in models else a.quorum == M, "DecoupledDiLoCo.quorum",
              a.quorum, f"an integer in [1, {M}]" if "quorum" in models
              else f"{M} (every learner) in {layer}: the quorum comes with Quorum")
        check(a.merge == "mean" or "rda" in models, "DecoupledDiLoCo.merge", a.merge,
              f"'mean' in {layer}: RDA comes with Weighted")
        check(not c.failures or "failures" in models, "Cluster.failures", c.failures,
              f"none in {layer}: failures come with Failures")
        free = c.link.gbit_per_s == math.inf and c.link.latency_s == 0
        check(free or "links" in models, "Cluster.link", c.link,
              f"a free link in {layer}: finite links come with Run")
        check(a.bits == a.down_bits == 32 or "bits" in models, "DecoupledDiLoCo.bits",
              (a.bits, a.down_bits), f"32 both ways in {layer}: fewer bits come with Run")

    def run(self) -> list:
        for m in range(self.M):
            self.start_step(0.0, m)
        for p in range(len(self.frags)):
            self.push(self.step_time(self.ask_at[p]), ASK, p)
        t = 0.0
        while self.heap:
            if self.taken == self.budget and self.heap[0][0] > t:
                break  # the budget ran out at t: what happened at that instant is done
            t, kind, _, data = heapq.heappop(self.heap)
            getattr(self, HANDLERS[kind])(t, *data)
        return self.finish(t)

    # ---- the learners: they never wait ------------------------------------------------------
    def start_step(self, t, m):
        self.push(t + self.clock.duration(m, self.learners[m].steps), BOUNDARY, m)

    def boundary(self, t, m):
        """Learner m finished a step: it answers the asks it holds, then applies what is due."""
        if self.taken == self.budget:
            return  # the budget ran out at this very instant: this step does not count
        L, s = self.learners[m], self.s
        L.params, L.opt_state = s.step(L.params, L.opt_state, s.batch(L.steps)[m])
        L.steps, L.since, self.taken = L.steps + 1, [n + 1 for n in L.since], self.taken + 1
        self.note(t, "step", m)
        for p in sorted(L.asked):
            L.ask_step.setdefault(p, L.steps)
            if p in L.merged:
                continue  # its Δ still holds steps the syncer merged: answer once applied
            sync, S = L.asked.pop(p), self.syncs[p]
            if S is not None and S.id == sync and m in S.unanswered:
                S.unanswered.discard(m)
                S.answers[m] = (self.weight(L, p), self.delta(L, p))
            self.push(self.answer_arrives_at(t, m, p), ARRIVE, p, m, sync)
            self.note(t, "answer", m, p)
        self.push(t, APPLY, m)

    def apply(self, t, m):
        """Learner m takes every published fragment that is due: θ ← αθ + (1−α)Θ, base ← Θ."""
        L, alpha = self.learners[m], self.algo.mix
        for p in [p for p, step in L.due.items() if L.steps >= step]:
            for i in self.frags[p]:
                L.params[i] = alpha * L.params[i] + (1 - alpha) * self.theta[i]
                L.base[i] = self.theta[i]
            L.since[p] = 0
            L.merged.discard(p)
            del L.due[p]
            self.note(t, "apply", m, p)
        if self.taken < self.budget:
            self.start_step(t, m)

    def weight(self, L, p):
        return 1.0  # the plain mean

    def delta(self, L, p):
        """Learner L's pseudo-gradient of fragment p, as the syncer receives it."""
        return [self.encode(L.base[i] - L.params[i]) for i in self.frags[p]]

    # ---- the syncer: one sync of each fragment at a time ----------------------------------
    def ask(self, t, p):
        """Open a sync of fragment p; ask every learner that is up."""
        S = self.syncs[p] = Sync(next(self.ids), t, set(range(self.M)))
        for L in self.learners:
            if L.up:
                L.asked[p] = S.id
        self.note(t, "ask", None, p)

    def arrive(self, t, p, m, sync):
        """Learner m's answer is in."""
        self.note(t, "arrive", m, p)
        S = self.syncs[p]
        if S is None or S.id != sync or m not in S.answers:
            return  # the sync closed without it, or m failed since it sent it
        S.arrived.add(m)
        self.close_if_done(t, p)

    def awaited(self, S):
        """The learners up whose answer to S has not arrived."""
        return [m for m, L in enumerate(self.learners) if L.up and (
            m in S.unanswered or (m in S.answers and m not in S.arrived))]

    def close_if_done(self, t, p):
        S = self.syncs[p]
        if S is not None and not self.awaited(S):
            self.close(t, p)

    def close(self, t, p):
        """Close p's sync: the merge goes to every learner up."""
        S, self.syncs[p] = self.syncs[p], None
        self.push(self.published_at(t, p), PUBLISH, p, {m: S.answers[m] for m in sorted(S.arrived)})
        self.note(t, "close", tuple(sorted(S.arrived)), p)

    def merge(self, p, weights, deltas):
        return weighted_mean(deltas, weights)

    def publish(self, t, p, answers):
        """The merge reaches the learners: the outer step on Θ_p; they know the sync is
        closed; each learner that is up applies it τ of its own steps after its ask (or after
        its next step)."""
        idx, a = self.frags[p], self.algo
        delta = self.merge(p, [w for w, _ in answers.values()], [d for _, d in answers.values()])
        new, vel = outer_nesterov([self.theta[i] for i in idx], [self.velocity[i] for i in idx],
                                  delta, a.outer_lr)
        for i, x, v in zip(idx, new, vel, strict=True):
            self.theta[i], self.velocity[i] = self.reply(self.theta[i], x), v
        for m, L in enumerate(self.learners):
            if m in answers:
                L.merged.add(p)
            if L.up:
                L.due[p] = min(L.due.get(p, math.inf), L.ask_step.get(p, L.steps + 1) + a.overlap)
            L.ask_step.pop(p, None)
            L.asked.pop(p, None)
        self.note(t, "publish", None, p)
        k = self.ask_at[p] + a.inner_steps  # the next ask: the first scheduled after now
        while self.step_time(k) <= t:
            k += a.inner_steps
        self.ask_at[p] = k
        self.push(self.step_time(k), ASK, p)

    # ---- the end of the run ---------------------------------------------------------------
    def finish(self, t) -> list:
        """What is in flight is published; then each fragment's work since the learners took the
        newest Θ_p (those up with no Θ_p still due) is averaged in by weight, with no outer step."""
        for when, kind, _, data in sorted(self.heap):
            if kind == PUBLISH:
                self.publish(when, *data)
                t = max(t, when)
        for p, idx in enumerate(self.frags):
            who = [m for m, L in enumerate(self.learners)
                   if L.up and p not in L.due and L.since[p] >= 1]
            if who:
                Ls = [self.learners[m] for m in who]
                delta = weighted_mean([self.delta(L, p) for L in Ls],
                                      [self.weight(L, p) for L in Ls])
                for i, d in zip(idx, delta, strict=True):
                    self.theta[i] = self.reply(self.theta[i], self.theta[i] - d)
                self.note(t, "flush", tuple(who), p)
        return self.theta

    # ---- the link and the bits: free and exact until layer 5 -------------------------------
    def encode(self, x):
        return x

    def reply(self, old, new):
        return new

    def answer_arrives_at(self, t, m, p):
        return t

    def published_at(self, t, p):
        return t

    # ---- plumbing: the heap, the reference steps, the log -----------------------------------
    def push(self, t, kind, *data):
        heapq.heappush(self.heap, (t, kind, next(self.seq), data))

    def step_time(self, k):
        """When reference step k ends (t_ref added up k times, as a clock adds them)."""
        while len(self.grid) <= k:
            self.grid.append(self.grid[-1] + self.clock.t_ref)
        return self.grid[k]

    def note(self, t, what, m=None, p=None):
        if self.log is not None:
            self.log.append((t, what, m, p))


class Quorum(Core):
    """Layer 2: close after K answers and a grace window that costs no compute."""

    ADDS = ("quorum",)

    def arrive(self, t, p, m, sync):
        super().arrive(t, p, m, sync)  # counted, and closed if no learner is still awaited
        S, a = self.syncs[p], self.algo
        if S is not None and S.quorum_t is None and len(S.arrived) >= a.quorum:
            S.quorum_t = t  # slack: what is left of τ reference steps after the reply's trip
            slack = a.overlap * self.clock.t_ref - ((t - S.asked_t) + self.reply_trip(t, p))
            S.deadline = t + (a.grace_safety * slack if slack > 0 else 0.0)
            self.push(S.deadline, DEADLINE, p, S.id)
            self.close_if_done(t, p)

    def deadline(self, t, p, sync):
        S = self.syncs[p]
        if S is not None and S.id == sync and t >= S.deadline:
            self.close(t, p)  # the grace window is over: close with what has arrived

    def close_if_done(self, t, p):
        S = self.syncs[p]
        if S is not None and S.quorum_t is not None and not self.awaited(S):
            self.close(t, p)

    def reply_trip(self, t, p):
        return 0.0  # a free link


class Weighted(Quorum):
    """Layer 3: token weights, and Radial-Directional Averaging (the embeddings by the mean)."""

    ADDS = ("rda",)

    def weight(self, L, p):
        n = L.since[p]  # steps since its base: tokens · tokens per step
        return (n * self.tokens) ** 2 / n

    def merge(self, p, weights, deltas):
        names = [self.s.names[i] for i in self.frags[p]]
        return split_merge(names, weights, deltas, rda_=self.algo.merge == "rda")


class Failures(Weighted):
    """Layer 4: learners fail, lose their unmerged work and come back with Θ and a peer's
    optimizer state."""

    ADDS = ("failures",)

    def start_step(self, t, m):
        """Learner m starts a step: it ends it, or fails during it."""
        end = t + self.clock.duration(m, self.learners[m].steps)
        window = self.clock.window(m, self.learners[m].failures)
        if window is not None and window[0] < end:
            self.push(window[0], FAIL, m)
        else:
            self.push(end, BOUNDARY, m)

    def fail(self, t, m):
        """Learner m goes down: its state and unmerged work are lost; the syncer drops it."""
        L = self.learners[m]
        back = self.clock.window(m, L.failures)[1]
        L.up, L.failures = False, L.failures + 1
        if math.isfinite(back):
            self.push(back, REJOIN, m)
        self.note(t, "fail", m)
        for p, S in enumerate(self.syncs):
            if S is not None:  # weight 0: out of the merge and of the quorum
                S.answers.pop(m, None)
                S.arrived.discard(m)
                if S.quorum_t is not None and len(S.arrived) < self.algo.quorum:
                    S.quorum_t, S.deadline = None, math.inf
                self.close_if_done(t, p)

    def rejoin(self, t, m):
        """Learner m is back with Θ and a healthy peer's optimizer state (a fresh one if no
        peer is up); the syncs still open that it had not answered ask it again."""
        old, peers = self.learners[m], [L for L in self.learners if L.up]
        opt_state = peers[0].opt_state if peers else self.s.optimizer.init(self.theta)
        L = self.learners[m] = Learner(list(self.theta), opt_state, list(self.theta),
                                       [0] * len(self.frags), old.steps, failures=old.failures)
        self.note(t, "rejoin", m)
        for p, S in enumerate(self.syncs):
            if S is not None and m in S.unanswered:
                L.asked[p] = S.id
        self.start_step(t, m)


class Run(Failures):
    """Layer 5, the whole method: finite links (first in, first out at each host) and b bits."""

    ADDS = ("links", "bits")

    def __init__(self, config, params=None, log=None):
        super().__init__(config, params, log)
        self.link = self.clock.cluster.link
        tensors = [[self.s.init[i] for i in f] for f in self.frags]
        self.up_bytes = [payload_bytes(x, self.algo.bits) for x in tensors]
        self.down_bytes = [payload_bytes(x, self.algo.down_bits) for x in tensors]
        self.tx, self.rx = [0.0] * (self.M + 1), [0.0] * (self.M + 1)  # hosts' links: when free

    def encode(self, x):
        return quantize(x, self.algo.bits)

    def reply(self, old, new):
        """What the learners receive: `new`, or in fewer bits than 32 the update, rounded."""
        bits = self.algo.down_bits
        return new if bits == 32 else old + quantize(new - old, bits)

    def answer_arrives_at(self, t, m, p):
        """Learner m's host (m + 1) sends its answer to the syncer's (host 0)."""
        end = max(t, self.tx[m + 1], self.rx[0]) + self.link.busy_s(self.up_bytes[p])
        self.tx[m + 1] = self.rx[0] = end
        return end + self.link.latency_s

    def copies(self, t, p):
        """Θ_p sent at t to each learner up, one copy after the other: when the last arrives,
        and the syncer's and the learners' links afterwards (nothing booked)."""
        tx, rx, last = self.tx[0], list(self.rx), t
        for m, L in enumerate(self.learners):
            if L.up:
                tx = rx[m + 1] = max(t, tx, rx[m + 1]) + self.link.busy_s(self.down_bytes[p])
                last = max(last, tx + self.link.latency_s)
        return last, tx, rx

    def reply_trip(self, t, p):
        return self.copies(t, p)[0] - t

    def published_at(self, t, p):
        last, self.tx[0], self.rx = self.copies(t, p)
        return last
