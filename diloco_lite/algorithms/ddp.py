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

`DDP(bits=16)` moves the gradient in bfloat16, half the bytes (`bf16_all_reduce`). Not as a
`pmean` of bfloat16 values: XLA on CPU widens a 16-bit all-reduce (and reduce-scatter) to fp32
before it reaches the network, and moves a narrowing cast past a collective that only moves
data. So the values travel bit-cast to uint16, which no pass widens (`wire.WireFormat(16)`), in
the two halves of a ring all-reduce: an all-to-all (device d receives chunk d of every device's
gradient: the reduce-scatter's traffic) and an all-gather of the reduced chunks. Each device
sends 2(D−1)/D of the payload, as a ring all-reduce does, in two collectives. (With one device
per host, as the testbed runs DDP, that is each host's link. With several devices per host the
all-to-all sends every device's chunks to each remote device directly: more than a ring
would put on the host's link.)
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..devices import AXIS
from ..model import token_nll_and_correct
from ..steps import inner_step
from ..wire import WireFormat

BF16 = WireFormat(16)  # bfloat16 bit-cast to uint16: what DDP(bits=16) puts on the network


def bf16_nbytes(n_values: int, devices: int) -> int:
    """Bytes of one device's bfloat16 gradient on the wire: `n_values` padded to whole chunks
    (one per device, so that the all-to-all splits it evenly)."""
    return BF16.nbytes((devices * math.ceil(n_values / devices),))


def bf16_all_reduce(loss, grads, devices: int):
    """(mean loss, mean gradient) over the `devices` of the axis, the gradient in bfloat16.

    Every device rounds its gradient to bfloat16 and sends chunk d of it to device d
    (all-to-all); device d adds the D chunks it received in fp32, divides by D and rounds the
    mean to bfloat16; an all-gather brings every mean chunk to every device, which widens them
    to fp32 for the optimizer. Every device gets the same bits. The fp32 loss rides along in the
    all-gather, bit-cast (4 bytes per device), and is averaged exactly."""
    flat, unravel = ravel_pytree(grads)
    n = flat.size
    chunk = bf16_nbytes(n, devices) // 2 // devices
    padded_DxC = jnp.pad(flat, (0, devices * chunk - n)).reshape(devices, chunk)
    got_DxC = jax.lax.all_to_all(BF16.encode(padded_DxC)["codes"], AXIS, 0, 0)
    mine_C = jnp.sum(BF16.decode({"codes": got_DxC}, got_DxC.shape), axis=0) / devices
    loss_2 = jax.lax.bitcast_convert_type(loss.astype(jnp.float32), jnp.uint16)
    sent = jnp.concatenate([BF16.encode(mine_C)["codes"], loss_2])
    all_DxC2 = jax.lax.all_gather(sent, AXIS)
    mean = BF16.decode({"codes": all_DxC2[:, :chunk]}, (devices * chunk,))[:n]
    losses_D = jax.lax.bitcast_convert_type(all_DxC2[:, chunk:], jnp.float32)
    return jnp.mean(losses_D), unravel(mean)


@functools.lru_cache(maxsize=16)  # runs of one model, mesh and schedule share it
def ddp_step_fn(model, mesh, optimizer, donate: bool = True, bits: int = 32):
    """Jitted `step(params, opt_state, batch_MxBxL1, share_M) -> (params, opt_state, loss)`.

    `share_M` weighs each worker's loss: M·w_m / Σw (all ones when every worker is up; 0 for
    a worker that is down, so elastic DDP averages over the others). `bits`: 32 all-reduces
    the fp32 gradient (one `pmean`); 16 moves it in bfloat16 (`bf16_all_reduce`). With several
    workers on a device, their gradients are added in fp32 before the device rounds it."""

    def local_loss(params, batch_and_share):
        batch_mxBxL1, share_m = batch_and_share
        m, _, l1 = batch_mxBxL1.shape
        # One forward over all the device's sequences (as a hand-written step would: a vmap over
        # workers cost 1.12-1.19x, issue 16), then each worker's mean loss, weighted by its share.
        nll_mBxL, _ = token_nll_and_correct(model, params, batch_mxBxL1.reshape(-1, l1))
        loss_m = jnp.mean(nll_mBxL.reshape(m, -1, l1 - 1), axis=(1, 2))
        return jnp.mean(share_m * loss_m)

    def all_reduce(loss, grads):  # the one collective of a DDP step, on one flat buffer
        if bits == 16:
            return bf16_all_reduce(loss, grads, mesh.devices)
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

    def __init__(self, model, mesh, optimizer, params, bits: int = 32):
        self.mesh, self.optimizer = mesh, optimizer
        self.step_fn = ddp_step_fn(model, mesh, optimizer, bits=bits)
        self.sizes = [sum(x.size for x in jax.tree.leaves(params))]
        # one gradient per worker: fp32, or bfloat16 as the all-to-all moves it (padding too)
        self.up_nbytes = [WireFormat(32).tree_nbytes(params) if bits == 32
                          else bf16_nbytes(self.sizes[0], mesh.devices)]
        self.down_nbytes = [0]
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
