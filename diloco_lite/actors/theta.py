"""The syncer's numbers in the actor runtime: Θ, the outer optimizer's state of each fragment,
and the merge of a fragment's answers.

`SyncerParams` holds them and computes a merge with the lock-step driver's own `merge_step`
(`algorithms.learners`: decode, weighted mean or RDA, outer step, the reply's rounding), on the
answers' wire-format bytes as they arrived. It decides nothing: `actors.syncer.SyncerRuntime`
says which answers a merge takes and when its result is taken. Nothing here imports Ray.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..algorithms.learners import LearnersDriver, merge_step
from ..outer import take_leaves
from ..training import setup
from ..wire import from_bytes


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
        self._merge = jax.jit(functools.partial(merge_step, d.outer_optimizer, d.up, d.down),
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

    def params(self):
        """Θ as the model's parameter tree, on the host."""
        return jax.tree.unflatten(self.treedef, self.leaves())

    def merge(self, p: int, weights: dict, payloads: dict, flush: bool):
        """Fragment p's merge of `payloads` (learner -> bytes) with `weights` (learner ->
        weight; the flush: the plain weighted mean, no outer step). Returns its result for
        `take`; Θ does not change until then (fragment p has one version in flight)."""
        w = np.zeros(self.M, np.float32)
        for m, x in weights.items():
            w[m] = x
        d = self.driver
        out = self._merge(take_leaves(self.global_, self.frags[p]), self.outer[p],
                          self._stack(p, payloads), jnp.asarray(w),
                          mean_leaves=d.mean_leaves[p], rda=d.rda, flush=flush)
        return jax.block_until_ready(out)

    def take(self, p: int, result) -> np.ndarray:
        """Θ_p and its outer state become the merge's `result`; returns its diagnostics."""
        new, outer, diag = result
        for i, x in zip(self.frags[p], new, strict=True):
            self.global_[i] = x
        self.outer[p] = outer
        return np.asarray(diag)

    def _stack(self, p: int, payloads: dict):
        """The M learners' payloads of fragment p, stacked (zeros where none: weight 0)."""
        buf = np.zeros((self.M, self.nbytes(p)), np.uint8)
        for m, b in payloads.items():
            buf[m] = b
        return from_bytes(jnp.asarray(buf), self.like[p])
