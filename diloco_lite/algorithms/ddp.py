"""Data-parallel training (ALGORITHMS.md §1): one all-reduce of the gradient per step.

Parameters and optimizer state are replicated (`P()`), the batch is sharded over the `workers`
axis. Inside one `shard_map` (with `check_vma=False`, i.e. no implicit collectives inserted by
autodiff) each device takes the gradient of the mean loss over its own workers' sequences,
`pmean`s it over the axis — one all-reduce — and applies the same optimizer update as every
other device. This is the "equivalent formulation" ALGORITHMS.md allows; the test
`test_ddp_equals_large_batch` proves it equals one worker on the whole global batch.

Why not `jax.grad` outside the `shard_map`? It is correct too, but its transpose all-reduces one
cotangent per *use* of a replicated parameter, so the tied embedding (used by the lookup and by
the output head) crosses the network twice. And why not `jax.grad` inside a `check_vma=True`
`shard_map` followed by `pmean`? There autodiff already sums the gradient of a replicated
parameter over the axis, so the result is M times the true gradient. Notebook 01 shows both.
"""

from __future__ import annotations

import functools

import jax

from ..comm import payload_bytes
from ..devices import AXIS
from ..steps import inner_step


def ddp_step_fn(model, mesh, optimizer):
    """Jitted `step(params, opt_state, batch_MxBxL1) -> (params, opt_state, loss)`."""

    def local_loss(params, batch_mxBxL1):
        return model.loss(params, batch_mxBxL1.reshape(-1, batch_mxBxL1.shape[-1]))

    def all_reduce(loss, grads):  # the one collective of a DDP step
        return jax.lax.pmean((loss, grads), AXIS)

    local_step = functools.partial(inner_step, local_loss, optimizer, reduce=all_reduce)
    sharded = jax.shard_map(local_step, mesh=mesh.mesh,
                            in_specs=(jax.P(), jax.P(), jax.P(AXIS)),
                            out_specs=(jax.P(), jax.P(), jax.P()), check_vma=False)
    return jax.jit(sharded)


class DDPDriver:
    def __init__(self, model, mesh, optimizer):
        self.mesh, self.optimizer = mesh, optimizer
        self.step_fn = ddp_step_fn(model, mesh, optimizer)
        self.bytes_per_step = None

    def init(self, params):
        params = jax.device_put(params, self.mesh.sharding())
        self.bytes_per_step = self.mesh.workers * payload_bytes(params, 32)
        return params, jax.device_put(self.optimizer.init(params), self.mesh.sharding())

    def block(self, step: int) -> int:
        return 1

    def place_batches(self, batches_NxMxBxL1):
        return jax.device_put(batches_NxMxBxL1, self.mesh.sharding(None, AXIS))

    def advance(self, state, batches_NxMxBxL1, step: int):
        params, opt_state = state
        params, opt_state, loss = self.step_fn(params, opt_state, batches_NxMxBxL1[0])
        info = {"loss": loss, "bytes": self.bytes_per_step,
                "peak_step_bytes": self.bytes_per_step}
        return (params, opt_state), info

    def global_params(self, state):
        return state[0]
