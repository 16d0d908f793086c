"""Data-parallel training (docs/algorithms.md §1): one all-reduce of the gradient per step.

Parameters and optimizer state are replicated (`P()`), the batch is sharded over the `workers`
axis. Inside one `shard_map` (with `check_vma=False`, i.e. no implicit collectives inserted by
autodiff) each device takes the gradient of the mean loss over its own workers' sequences,
`pmean`s it over the axis — one all-reduce — and applies the same optimizer update as every
other device. This is the library's choice of the two formulations docs/algorithms.md §1
gives; the test `test_ddp_equals_large_batch` proves it equals one worker on the whole global
batch.

Why not `jax.grad` outside the `shard_map`? It is correct too, but its transpose all-reduces one
cotangent per *use* of a replicated parameter, so the tied embedding (used by the lookup and by
the output head) crosses the network twice. And why not `jax.grad` inside a `check_vma=True`
`shard_map` followed by `pmean`? There autodiff already sums the gradient of a replicated
parameter over the axis, so the result is M times the true gradient. Notebook 01 shows both.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..devices import AXIS
from ..model import token_nll_and_correct
from ..steps import inner_step
from ..wire import WireFormat


@functools.lru_cache(maxsize=16)  # runs of one model, mesh and schedule share it
def ddp_step_fn(model, mesh, optimizer, donate: bool = True):
    """Jitted `step(params, opt_state, batch_MxBxL1, share_M) -> (params, opt_state, loss)`.

    `share_M` weighs each worker's loss: M·w_m / Σw (all ones when every worker is up; 0 for
    a worker that is down, so elastic DDP averages over the others)."""

    def local_loss(params, batch_and_share):
        batch_mxBxL1, share_m = batch_and_share
        m, _, l1 = batch_mxBxL1.shape
        # One forward over all the device's sequences (as a hand-written step would: a vmap over
        # workers cost 1.12-1.19x, issue 16), then each worker's mean loss, weighted by its share.
        nll_mBxL, _ = token_nll_and_correct(model, params, batch_mxBxL1.reshape(-1, l1))
        loss_m = jnp.mean(nll_mBxL.reshape(m, -1, l1 - 1), axis=(1, 2))
        return jnp.mean(share_m * loss_m)

    def all_reduce(loss, grads):  # the one collective of a DDP step, on one flat buffer
        flat, unravel = ravel_pytree((loss, grads))  # (gloo would run one ring per tensor)
        return unravel(jax.lax.pmean(flat, AXIS))

    def local_step(params, opt_state, batch_mxBxL1, share_m):
        return inner_step(local_loss, optimizer, params, opt_state, (batch_mxBxL1, share_m),
                          reduce=all_reduce)

    sharded = jax.shard_map(local_step, mesh=mesh.mesh,
                            in_specs=(jax.P(), jax.P(), jax.P(AXIS), jax.P(AXIS)),
                            out_specs=(jax.P(), jax.P(), jax.P()), check_vma=False)
    return jax.jit(sharded, donate_argnums=(0, 1) if donate else ())


class DDPDriver:
    """Runs a DDP plan: every block is one step, whose `close` event carries the weights."""

    def __init__(self, model, mesh, optimizer, params):
        self.mesh, self.optimizer = mesh, optimizer
        self.step_fn = ddp_step_fn(model, mesh, optimizer)
        self.up_nbytes = [WireFormat(32).tree_nbytes(params)]  # one fp32 gradient per worker
        self.down_nbytes = [0]
        self.sizes = [sum(x.size for x in jax.tree.leaves(params))]
        self.rejoin_nbytes = 0  # parameters and optimizer state are replicated already

    def init(self, params):
        opt_state = jax.jit(self.optimizer.init)(params)  # before placement: one small compile
        return self.mesh.put((params, opt_state))

    def global_params(self, state):
        return state[0]

    def run(self, state, block, batches_MxNxBxL1, mask_MxN):
        params, opt_state = state
        losses = []
        for ev in block.events:
            if ev.kind != "close":
                continue  # DDP holds no per-worker state: reloads have nothing to do
            share = (ev.weights * ev.weights.size / ev.weights.sum()).astype(np.float32)
            placed = self.mesh.put_rows(batches_MxNxBxL1[:, 0]), self.mesh.put(share, AXIS)
            params, opt_state, loss = self.step_fn(params, opt_state, *placed)
            losses.append(loss)  # one loss for every worker of the step
        return (params, opt_state), losses, []
