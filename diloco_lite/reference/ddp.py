"""Data-parallel training: every step, the M workers' gradients are averaged and every worker
applies the same update, so one copy of the parameters is all there is.

`DDP(bits=16)`: each worker's gradient is rounded to bfloat16 before it is sent, the mean (added
in fp32) is rounded to bfloat16 before it is sent back, and the optimizer works in fp32."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .common import refuse_lockstep, setup


def bf16(x):
    """`x` as it arrives after travelling in bfloat16: rounded to 8 significant bits."""
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def ddp(config, params=None) -> list:
    """Train `config` (a `RunConfig` of `DDP()`) and return the parameters (a list of leaves)."""
    refuse_lockstep(config, "DDP")
    run = setup(config, params)
    send = bf16 if config.algorithm.bits == 16 else (lambda x: x)
    theta, opt_state = run.init, run.optimizer.init(run.init)
    grad = jax.jit(jax.grad(run.loss))
    for k in range(config.steps):
        batch_MxBxL1 = run.batch(k)
        grads = [[send(x) for x in grad(theta, batch_MxBxL1[m])] for m in range(config.workers)]
        mean = [send(sum(g[i] for g in grads) / config.workers) for i in range(len(theta))]
        updates, opt_state = run.optimizer.update(mean, opt_state, theta)  # the all-reduce's
        theta = [x + u for x, u in zip(theta, updates, strict=True)]        # result, applied
    return theta
