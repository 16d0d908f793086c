"""Data-parallel training: every step, the M workers' gradients are averaged and every worker
applies the same update, so one copy of the parameters is all there is."""

from __future__ import annotations

import jax

from .common import refuse_lockstep, setup


def ddp(config, params=None) -> list:
    """Train `config` (a `RunConfig` of `DDP()`) and return the parameters (a list of leaves)."""
    refuse_lockstep(config, "DDP")
    run = setup(config, params)
    theta, opt_state = run.init, run.optimizer.init(run.init)
    grad = jax.jit(jax.grad(run.loss))
    for k in range(config.steps):
        batch_MxBxL1 = run.batch(k)
        grads = [grad(theta, batch_MxBxL1[m]) for m in range(config.workers)]
        mean = [sum(g[i] for g in grads) / config.workers for i in range(len(theta))]
        updates, opt_state = run.optimizer.update(mean, opt_state, theta)  # the all-reduce's
        theta = [x + u for x, u in zip(theta, updates, strict=True)]        # result, applied
    return theta
