"""The outer loop's pieces, shared by DiLoCo, Streaming DiLoCo and Decoupled DiLoCo.

- `pseudo_gradient(global, local)`: Δ = θ − θ_m (docs/algorithms.md §2), which points uphill like a
  gradient, so a *descent* step on it moves θ toward where the workers went;
- `outer_step(...)`: one step of the outer optimizer on Δ (default Nesterov SGD, lr 0.7,
  momentum 0.9);
- merges of several workers' Δ: `mean_merge` (DiLoCo, Streaming DiLoCo) and `rda_merge`
  (Radial-Directional Averaging, §4: Decoupled DiLoCo's syncer);
- `fragments(params, P, how)`: which tensors go in which of the P fragments (§3).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from .config import check

DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM = 0.7, 0.9


@functools.cache  # one object per lr: the compiled syncs are shared across runs (`learners`)
def default_outer_optimizer(lr: float = DEFAULT_OUTER_LR) -> optax.GradientTransformation:
    """DiLoCo's outer optimizer: SGD with Nesterov momentum (lr 0.7, momentum 0.9)."""
    return optax.sgd(lr, momentum=DEFAULT_OUTER_MOMENTUM, nesterov=True)


def resolve_outer_optimizer(algorithm) -> optax.GradientTransformation:
    """The algorithm's `outer_optimizer`, else Nesterov SGD at its `outer_lr`."""
    opt = getattr(algorithm, "outer_optimizer", None)
    lr = float(getattr(algorithm, "outer_lr", DEFAULT_OUTER_LR))
    return default_outer_optimizer(lr) if opt is None else opt


def pseudo_gradient(global_params: Any, local_params: Any) -> Any:
    """Δ = θ − θ_m, leaf by leaf."""
    return jax.tree.map(jnp.subtract, global_params, local_params)


def outer_step(optimizer: optax.GradientTransformation, params: Any, opt_state: Any,
               pseudo_grad: Any):
    """θ ← θ + outer_opt.update(Δ): Δ is fed to the optimizer as if it were a gradient."""
    updates, opt_state = optimizer.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def tree_norm(tree: Any) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def mean_merge(deltas_M: Any, weights_M: jax.Array) -> Any:
    """Weighted mean over the leading (worker) axis: Σ w_m Δ_m / Σ w_m."""
    w = weights_M / jnp.sum(weights_M)
    return jax.tree.map(lambda d: jnp.tensordot(w, d, axes=1), deltas_M)


def rda_merge(deltas_M: Any, weights_M: jax.Array, eps: float = 1e-12) -> Any:
    """Radial-Directional Averaging: average norms and directions separately (§4).

    r = Σ w‖Δ_m‖ / Σ w,  u = Σ w Δ_m/‖Δ_m‖,  Δ = r · u/‖u‖. Unlike the plain mean, the merged
    norm does not shrink like 1/√M when the Δ_m are nearly orthogonal.
    """
    norms_M = jax.vmap(tree_norm)(deltas_M)
    w = weights_M / jnp.sum(weights_M)
    radius = jnp.sum(w * norms_M)
    direction = mean_merge(jax.tree.map(
        lambda d: d / jnp.maximum(norms_M, eps).reshape((-1,) + (1,) * (d.ndim - 1)), deltas_M),
        w)
    scale = radius / jnp.maximum(tree_norm(direction), eps)
    return jax.tree.map(lambda u: scale * u, direction)


# --------------------------------------------------------------------------------------------
# Fragments
# --------------------------------------------------------------------------------------------


def fragments(params: Any, count: int, how: str = "balanced", field: str = "fragments"):
    """Split the tensors of `params` into `count` fragments; returns a list of leaf-index lists.

    - "balanced" (default, the Decoupled paper's choice): greedy bin-packing, largest tensor
      first into the currently smallest fragment, so fragments carry similar byte counts;
    - "layers": the tensors in depth order (`model.depth_order`: embeddings, block_0, block_1,
      …, final norm) cut into `count` contiguous runs of similar size — the paper's layer-wise
      split.
    """
    from .model import depth_order

    sizes = [int(x.size) for x in jax.tree.leaves(params)]
    check(1 <= count <= len(sizes), field, count, f"an integer in [1, {len(sizes)}] "
          f"(the model has {len(sizes)} tensors)")
    if how == "balanced":
        bins: list[list[int]] = [[] for _ in range(count)]
        totals = [0] * count
        for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            j = totals.index(min(totals))
            bins[j].append(i)
            totals[j] += sizes[i]
        return [sorted(b) for b in bins]
    check(how == "layers", "fragmentation", how, "'balanced' or 'layers'")
    order = depth_order(params)
    total, out, start, cumulative = sum(sizes), [], 0, 0
    for p in range(count):
        target = total * (p + 1) / count
        stop = start + 1
        cumulative += sizes[order[start]]
        # leave at least one tensor for each remaining fragment
        while (stop < len(order) - (count - p - 1)
               and cumulative + sizes[order[stop]] / 2 <= target):
            cumulative += sizes[order[stop]]
            stop += 1
        if p == count - 1:
            stop = len(order)
        out.append(sorted(order[start:stop]))
        start = stop
    return out


def take_leaves(tree: Any, indices: list[int]) -> list:
    """The leaves of `tree` at `indices` (a fragment), as a list."""
    leaves = jax.tree.leaves(tree)
    return [leaves[i] for i in indices]


def put_leaves(tree: Any, indices: list[int], values: list) -> Any:
    """A copy of `tree` with the leaves at `indices` replaced by `values`."""
    leaves, treedef = jax.tree.flatten(tree)
    for i, v in zip(indices, values, strict=True):
        leaves[i] = v
    return jax.tree.unflatten(treedef, leaves)
