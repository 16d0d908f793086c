"""The syncer's numbers in the actor runtime: Θ, the outer optimizer's state of each fragment,
the merge of a fragment's answers, and its reply.

`SyncerParams` holds them and computes a merge with the lock-step driver's own `merge_step`
(`algorithms.learners`: decode, weighted mean or RDA, outer step), on the answers' wire-format
bytes as they arrived, and the reply that goes to each learner: Θ_p in fp32, or with
`down_bits` < 32 the update through the b-bit wire format (`reply_payload`), as the bytes that
travel. Everyone holding the old Θ_p makes the same new one of it (`apply_reply`: one compiled
program, run by the syncer on its own copy and by each learner on its copy). It decides
nothing: `actors.syncer.SyncerRuntime` says which answers a merge takes and when its result is
taken. Nothing here imports Ray.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..algorithms.learners import LearnersDriver, merge_step, reply_payload, take_reply
from ..outer import take_leaves
from ..training import setup
from ..wire import WireFormat, from_bytes, to_bytes


@functools.partial(jax.jit, static_argnums=0)
def _apply_reply(bits: int, old: list, payload: list) -> list:
    return take_reply(WireFormat(bits), old, payload)


def apply_reply(bits: int, old: list, reply: np.ndarray, like) -> list[np.ndarray]:
    """The new Θ_p (host arrays) from the old one and a reply's bytes (`like`: the payload's
    shapes, `SyncerParams.reply_like`)."""
    new = _apply_reply(bits, [jnp.asarray(x) for x in old],
                       from_bytes(jnp.asarray(reply), like, batch_dims=0))
    return [np.asarray(x) for x in new]


def reply_like(bits: int, fragment: list):
    """The shapes of fragment p's reply payload (its tensors `fragment`)."""
    return jax.eval_shape(lambda f: reply_payload(WireFormat(bits), f, f), fragment)


class SyncerParams:
    """Θ of `config`'s model from `params` (None: the model's initial parameters for
    `config.seed`), the outer optimizer's states and the compiled merge (module docstring).
    `driver`: the lock-step driver built for it (its fragments and bytes per fragment)."""

    def __init__(self, config, params=None):
        _, model, mesh, optimizer = setup(config, workers=1)
        params = params if params is not None else model.init(config.seed)
        self.driver = d = LearnersDriver(config, model, mesh, optimizer, params)
        self.M, self.frags = config.workers, d.frags
        self.treedef = jax.tree.structure(params)
        self.global_ = [jnp.asarray(x) for x in jax.tree.leaves(params)]
        frags = [take_leaves(self.global_, f) for f in self.frags]
        self.outer = [d.outer_optimizer.init(f) for f in frags]
        self.like = [jax.tree.map(lambda s: jax.ShapeDtypeStruct((1,) + s.shape, s.dtype),
                                  jax.eval_shape(lambda f: [d.up.encode(x) for x in f], f))
                     for f in frags]
        self.bits = d.down.bits
        self.reply_like = [reply_like(self.bits, f) for f in frags]
        self._merge = jax.jit(functools.partial(_merge_reply, d.outer_optimizer, d.up, d.down),
                              static_argnames=("mean_leaves", "rda", "flush"))
        for p in range(len(frags)):  # compile the merges before the clock starts
            for flush in (False, True):
                self.merge(p, {}, {}, flush)

    def nbytes(self, p: int) -> int:
        """One learner's payload of fragment p, in bytes."""
        return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(self.like[p]))

    def fragment(self, p: int) -> list[np.ndarray]:
        """Θ_p's leaves, on the host."""
        return [np.asarray(x) for x in take_leaves(self.global_, self.frags[p])]

    def leaves(self) -> list[np.ndarray]:
        """Θ's leaves, on the host."""
        return [np.asarray(x) for x in self.global_]

    def assemble(self, fragments: list) -> list:
        """Θ's leaves from each fragment's leaves (`fragments[p]`, in `frags[p]`'s order)."""
        out = [None] * sum(len(f) for f in self.frags)
        for idx, leaves in zip(self.frags, fragments, strict=True):
            for i, x in zip(idx, leaves, strict=True):
                out[i] = x
        return out

    def params(self):
        """Θ as the model's parameter tree, on the host."""
        return jax.tree.unflatten(self.treedef, self.leaves())

    def merge(self, p: int, weights: dict, payloads: dict, flush: bool):
        """Fragment p's merge of `payloads` (learner -> bytes) with `weights` (learner ->
        weight; the flush: the plain weighted mean, no outer step). Returns its result for
        `take`, the reply's bytes last; Θ does not change until then (fragment p has one
        version in flight)."""
        w = np.zeros(self.M, np.float32)
        for m, x in weights.items():
            w[m] = x
        d = self.driver
        old = take_leaves(self.global_, self.frags[p])
        outer, diag, payload = self._merge(old, self.outer[p], self._stack(p, payloads),
                                           jnp.asarray(w), mean_leaves=d.mean_leaves[p],
                                           rda=d.rda, flush=flush)
        reply = np.asarray(to_bytes(payload, batch_dims=0))
        new = apply_reply(self.bits, old, reply, self.reply_like[p])  # as each learner does
        return new, outer, np.asarray(diag), reply

    def take(self, p: int, result) -> np.ndarray:
        """Θ_p and its outer state become the merge's `result`; returns its diagnostics."""
        new, outer, diag, _ = result
        for i, x in zip(self.frags[p], new, strict=True):
            self.global_[i] = jnp.asarray(x)
        self.outer[p] = outer
        return diag

    def _stack(self, p: int, payloads: dict):
        """The M learners' payloads of fragment p, stacked (zeros where none: weight 0)."""
        buf = np.zeros((self.M, self.nbytes(p)), np.uint8)
        for m, b in payloads.items():
            buf[m] = b
        return from_bytes(jnp.asarray(buf), self.like[p])


def _merge_reply(outer_optimizer, up, down, global_p, outer_p, sent_M, weights_M, mean_leaves,
                 rda, flush):
    """`merge_step` before the reply's rounding, and the reply's payload: (outer state,
    diagnostics, payload)."""
    new, outer_p, diag = merge_step(outer_optimizer, up, WireFormat(32), global_p, outer_p,
                                    sent_M, weights_M, mean_leaves, rda, flush)
    return outer_p, diag, reply_payload(down, global_p, new)
