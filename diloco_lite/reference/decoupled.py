"""Decoupled DiLoCo as one discrete-event program, to read top to bottom.

No barrier: each learner steps at its own pace on one simulated clock and never waits. A syncer
owns the global fragments Θ_p and, for each fragment, on its own schedule:

1. **asks** every learner that is up, at reference steps offset(p), offset(p) + H, … (Streaming
   DiLoCo's schedule, on the clock of the median learner: t_ref seconds a step);
2. each learner **answers** at its next step boundary with Δ = base − θ (base: the Θ_p it last
   took), in b bits, from its host to the syncer's (every host's link sends and receives first
   in, first out: the M answers queue on the syncer's side);
3. the syncer waits for a **quorum** of K answers, then a **grace window** (the slack it has
   before the learners need the result, times a safety factor), and closes as soon as no learner
   that is up is still awaited;
4. it **merges** the answers with token weights w = tokens · tokens/steps (Radial-Directional
   Averaging; the embeddings by the weighted mean), takes the **outer Nesterov step** on Θ_p and
   sends it (in `down_bits`) to each learner up, one copy after the other: it is **published**
   when the last has arrived. That message also tells the learners the sync is closed: a learner
   answers until then (a late answer is left out);
5. each learner **applies** it τ of its own steps after the ask: θ ← αθ + (1−α)Θ_p, base ← Θ_p.

A learner fails at the times of `Cluster.failures`: it loses its state and its unmerged work,
and the syncer leaves it out (weight 0). Back, it loads Θ and a healthy peer's optimizer state
(a fresh one if no peer is up) and answers the syncs still open. The run ends when the learners
together have taken M × `steps` steps (the tokens of the lock-step methods): what is in flight
is published, and every fragment's remaining work is averaged in once more (no outer step).

Events are `(time, kind, sequence, data)` on one heap: at equal times the kinds run in the order
below, and events of one kind in the order they were pushed.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

from ..clock import Timeline
from ..validate import check
from .common import balanced_fragments as fragments
from .common import first_send, outer_nesterov, payload_bytes, quantize, setup, split_merge

# what can happen, in the order it happens at equal times
ASK, BOUNDARY, ANSWER, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN, END = range(9)


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


class Run:
    def __init__(self, config, params=None, log=None):
        a = self.algo = config.algorithm
        check(a.fragmentation == "balanced", "DecoupledDiLoCo.fragmentation", a.fragmentation,
              "'balanced' in the reference")
        self.s = s = setup(config, params)
        self.M, self.budget, self.log = config.workers, config.workers * config.steps, log
        self.clock = Timeline(config.cluster, self.M)  # each learner's step times and failures
        self.link, self.tokens = self.clock.cluster.link, config.batch_size * config.seq_len
        self.frags = fragments(s.init, a.fragments)
        tensors = [[s.init[i] for i in f] for f in self.frags]
        self.up_bytes = [payload_bytes(x, a.bits) for x in tensors]
        self.down_bytes = [payload_bytes(x, a.down_bits) for x in tensors]
        self.theta, self.velocity = list(s.init), [0.0 * x for x in s.init]
        self.learners = [Learner(list(s.init), s.optimizer.init(s.init), list(s.init),
                                 [0] * a.fragments) for _ in range(self.M)]
        self.syncs = [None] * a.fragments  # each fragment's open sync
        self.ask_at = [first_send(p, a.inner_steps, a.fragments) for p in range(a.fragments)]
        self.grid, self.taken = [0.0], 0
        self.tx, self.rx = [0.0] * (self.M + 1), [0.0] * (self.M + 1)  # hosts' links: when free
        self.heap, self.seq, self.ids = [], itertools.count(), itertools.count()

    def run(self) -> list:
        handle = {ASK: self.ask, BOUNDARY: self.boundary, ANSWER: self.answer_arrives,
                  DEADLINE: self.deadline, PUBLISH: self.publish, APPLY: self.apply,
                  FAIL: self.fail, REJOIN: self.rejoin}
        for m in range(self.M):
            self.start_step(0.0, m)
        for p in range(len(self.frags)):
            self.push(self.step_time(self.ask_at[p]), ASK, p)
        t = 0.0
        while self.heap:
            t, kind, _, data = heapq.heappop(self.heap)
            if kind == END:
                break
            handle[kind](t, *data)
        for when, kind, _, data in sorted(self.heap):  # the end: what is in flight arrives,
            if kind == PUBLISH:
                self.publish(when, *data)
                t = max(t, when)
        self.flush(t)                                  # then every fragment's remaining work
        return self.theta

    # ---- the learners: they never wait ------------------------------------------------------
    def start_step(self, t, m):
        """Learner m starts a step: it ends it, or fails during it."""
        end = t + self.clock.duration(m, self.learners[m].steps)
        window = self.clock.window(m, self.learners[m].failures)
        if window is not None and window[0] < end:
            self.push(window[0], FAIL, m)
        else:
            self.push(end, BOUNDARY, m)

    def boundary(self, t, m):
        """Learner m finished a step: it answers the asks it holds, then applies what is due."""
        if self.taken == self.budget:
            return  # the budget ran out at this very instant: this step does not count
        L, s, a = self.learners[m], self.s, self.algo
        L.params, L.opt_state = s.step(L.params, L.opt_state, s.batch(L.steps)[m])
        L.steps, L.since, self.taken = L.steps + 1, [n + 1 for n in L.since], self.taken + 1
        self.note(t, "step", m)
        for p in sorted(L.asked):
            L.ask_step.setdefault(p, L.steps)
            if p in L.merged:
                continue  # its Δ still holds steps the syncer merged: answer once applied
            sync, n = L.asked.pop(p), L.since[p]
            S = self.syncs[p]
            if S is not None and S.id == sync and m in S.unanswered:
                S.unanswered.discard(m)
                S.answers[m] = ((n * self.tokens) ** 2 / n,  # tokens · tokens per step
                                [quantize(L.base[i] - L.params[i], a.bits) for i in self.frags[p]])
            self.push(self.message(m + 1, 0, self.up_bytes[p], t), ANSWER, p, m, sync)
            self.note(t, "answer", m, p)
        self.push(t, APPLY, m)
        if self.taken == self.budget:
            self.push(t, END)

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

    # ---- the syncer: one sync of each fragment at a time ----------------------------------
    def ask(self, t, p):
        """Open a sync of fragment p; ask every learner that is up."""
        S = self.syncs[p] = Sync(next(self.ids), t, set(range(self.M)))
        for L in self.learners:
            if L.up:
                L.asked[p] = S.id
        self.note(t, "ask", None, p)

    def answer_arrives(self, t, p, m, sync):
        """Learner m's answer is in: with K of them, the grace window starts."""
        self.note(t, "arrive", m, p)
        S = self.syncs[p]
        if S is None or S.id != sync or m not in S.answers:
            return  # the sync closed without it, or m failed since it sent it
        S.arrived.add(m)
        if S.quorum_t is None and len(S.arrived) >= self.algo.quorum:
            S.quorum_t = t  # slack: what is left of τ reference steps after the reply's trip
            slack = self.algo.overlap * self.clock.t_ref - (
                (t - S.asked_t) + (self.replies(p, t, book=False) - t))
            S.deadline = t + (self.algo.grace_safety * slack if slack > 0 else 0.0)
            self.push(S.deadline, DEADLINE, p, S.id)
        self.close_if_done(t, p)

    def deadline(self, t, p, sync):
        S = self.syncs[p]
        if S is not None and S.id == sync and t >= S.deadline:
            self.close_if_done(t, p, grace_over=True)

    def close_if_done(self, t, p, grace_over=False):
        """Close p's sync once it has its quorum and no learner that is up is still awaited,
        or the grace window is over; the merge goes to every learner up."""
        S = self.syncs[p]
        if S is None or S.quorum_t is None:
            return
        awaited = [m for m, L in enumerate(self.learners) if L.up and (
            m in S.unanswered or (m in S.answers and m not in S.arrived))]
        if awaited and not grace_over:
            return
        self.syncs[p] = None
        self.push(self.replies(p, t), PUBLISH, p, {m: S.answers[m] for m in sorted(S.arrived)})
        self.note(t, "close", tuple(sorted(S.arrived)), p)

    def publish(self, t, p, answers):
        """The merge reaches the learners: the outer step on Θ_p; they know the sync is
        closed; each learner that is up applies it τ of its own steps after its ask (or after
        its next step)."""
        idx, a = self.frags[p], self.algo
        delta = split_merge([self.s.names[i] for i in idx], [w for w, _ in answers.values()],
                            [d for _, d in answers.values()], rda_=a.merge == "rda")
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

    def flush(self, t):
        """The end: each fragment's work since the learners took the newest Θ_p (the learners
        up with no Θ_p still due), averaged in by token weight, with no outer step."""
        for p, idx in enumerate(self.frags):
            ids = [m for m, L in enumerate(self.learners)
                   if L.up and p not in L.due and L.since[p] >= 1]
            who = [self.learners[m] for m in ids]
            if who:
                self.note(t, "flush", tuple(ids), p)
                delta = split_merge(None, [(L.since[p] * self.tokens) ** 2 / L.since[p]
                                           for L in who],
                                    [[quantize(L.base[i] - L.params[i], self.algo.bits)
                                      for i in idx] for L in who], rda_=False)
                for i, d in zip(idx, delta, strict=True):
                    self.theta[i] = self.reply(self.theta[i], self.theta[i] - d)

    def reply(self, old, new):
        """What the learners receive: `new`, or in fewer bits than 32 the update, rounded."""
        bits = self.algo.down_bits
        return new if bits == 32 else old + quantize(new - old, bits)

    # ---- plumbing: the heap, the reference steps, the hosts' links, the log ----------------
    def push(self, t, kind, *data):
        heapq.heappush(self.heap, (t, kind, next(self.seq), data))

    def step_time(self, k):
        """When reference step k ends (t_ref added up k times, as a clock adds them)."""
        while len(self.grid) <= k:
            self.grid.append(self.grid[-1] + self.clock.t_ref)
        return self.grid[k]

    def message(self, a, b, nbytes, t):
        """When a message sent at t from host a to host b arrives (host 0: the syncer's; m + 1:
        learner m's): it waits for a's sending side and b's receiving side, holds both."""
        end = max(t, self.tx[a], self.rx[b]) + self.link.busy_s(nbytes)
        self.tx[a] = self.rx[b] = end
        return end + self.link.latency_s

    def replies(self, p, t, book=True):
        """When Θ_p, sent at t, has reached every learner up (one copy each, in turn; `book`:
        False to only predict it)."""
        tx, rx = self.tx[0], list(self.rx)
        last = max([self.message(0, m + 1, self.down_bytes[p], t)
                    for m, L in enumerate(self.learners) if L.up], default=t)
        if not book:
            self.tx[0], self.rx = tx, rx
        return last

    def note(self, t, what, m=None, p=None):
        if self.log is not None:
            self.log.append((t, what, m, p))
