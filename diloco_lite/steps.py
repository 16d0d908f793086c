"""The one inner step every algorithm reuses, and the default inner optimizer.

`inner_step(loss_fn, optimizer, params, opt_state, batch)` takes a gradient of `loss_fn` and
applies one optimizer update. The algorithms differ only in what happens to that gradient:

- DDP runs it inside `shard_map` with `reduce=` an all-reduce (`pmean`) of the gradient, so
  every device applies the same averaged update: one all-reduce per step;
- DiLoCo / Streaming / Decoupled run it per worker (vmapped inside `shard_map`) with no
  reduction, so their inner steps compile to zero collectives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import optax


def inner_step(loss_fn: Callable, optimizer: optax.GradientTransformation, params: Any,
               opt_state: Any, batch: jax.Array, *, reduce: Callable | None = None):
    """One optimizer step on `loss_fn(params, batch)`; returns (params, opt_state, loss).

    `reduce(loss, grads) -> (loss, grads)` runs between the gradient and the update: DDP passes
    its all-reduce there; local steps pass nothing.
    """
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    if reduce is not None:
        loss, grads = reduce(loss, grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@functools.cache  # one object per schedule: runs of the same schedule share compiled steps
def default_inner_optimizer(learning_rate: float, total_steps: int, warmup_steps: int,
                            weight_decay: float = 0.1) -> optax.GradientTransformation:
    """AdamW with linear warm-up and cosine decay to 10% (DiLoCo's inner optimizer, §2).

    The paper uses lr 4e-4 at 150M parameters; this ~0.1M-parameter character model trains
    well at a larger lr (3e-3 by default, `RunConfig.learning_rate`).
    """
    warmup = min(warmup_steps, max(total_steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=0.1 * learning_rate,
    )
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay),
    )


def resolve_inner_optimizer(config) -> optax.GradientTransformation:
    """`RunConfig.inner_optimizer`, or the default AdamW schedule when it is None."""
    if config.inner_optimizer is not None:
        return config.inner_optimizer
    return default_inner_optimizer(config.learning_rate, config.steps, config.warmup_steps)
