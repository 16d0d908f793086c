"""The pieces every method of the reference shares, each written out once.

A model's parameters are a flat list of arrays here (`jax.tree.leaves` order), so that a
fragment is a list of indices into it. Everything runs on one device, one learner at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..data import load_corpus
from ..model import build_model
from ..validate import check


@dataclasses.dataclass
class Setup:
    """What a run needs before its first step: `init` (the parameters, a list of leaves),
    `loss(leaves, batch)`, `step(leaves, opt_state, batch) -> (leaves, opt_state)` (one learner's
    optimizer step), `optimizer`, `batch(k)` (every learner's batch of data step k,
    `[M, B, L+1]`) and the top-level `names` of the leaves ("embed", "block_0", …)."""

    init: list
    loss: object
    step: object
    optimizer: optax.GradientTransformation
    batch: object
    names: list
    treedef: object


def setup(config, params=None) -> Setup:
    """The model, the data and the learners' optimizer of a `RunConfig` (`params`: start from
    these parameters instead of the model's initial ones for `config.seed`)."""
    check(config.warm_start is None or params is not None, "params", None,
          "the warm start's parameters (the reference does not train the warm start)")
    corpus = load_corpus(config.corpus)
    model = build_model(dataclasses.replace(config.model, vocab_size=config.model.vocab_size
                                            or corpus.vocab_size))
    tree = model.init(config.seed) if params is None else params
    leaves, treedef = jax.tree.flatten(tree)
    names = [path[0].key for path, _ in jax.tree_util.tree_leaves_with_path(tree)]
    optimizer = inner_optimizer(config)

    def loss(leaves, batch_BxL1):
        return model.loss(jax.tree.unflatten(treedef, leaves), batch_BxL1)

    @jax.jit
    def step(leaves, opt_state, batch_BxL1):
        grads = jax.grad(loss)(leaves, batch_BxL1)
        updates, opt_state = optimizer.update(grads, opt_state, leaves)
        return optax.apply_updates(leaves, updates), opt_state

    @functools.lru_cache(maxsize=64)
    def batch(k):
        return corpus.batch(config.data_offset + k, seed=config.seed, workers=config.workers,
                            batch_size=config.batch_size, seq_len=config.seq_len,
                            split=config.split)

    init = [jnp.asarray(x, jnp.float32) for x in leaves]
    return Setup(init, loss, step, optimizer, batch, names, treedef)


def refuse_lockstep(config, method: str) -> None:
    """A ValueError naming each setting of a lock-step method (`method`: its class name) that
    the reference does not model: failures (and elasticity), and an outer optimizer other than
    its outer Nesterov step."""
    a = config.algorithm
    check(type(a).__name__ == method, "RunConfig.algorithm", type(a).__name__, f"{method}()")
    check(not a.elastic, f"{method}.elastic", a.elastic, "False in the reference")
    failures = config.cluster.failures if config.cluster is not None else ()
    check(not failures, "Cluster.failures", failures,
          "none in the reference's lock-step methods")
    if hasattr(a, "outer_optimizer"):
        check(a.outer_optimizer is None, f"{method}.outer_optimizer", "custom",
              "None in the reference (its outer Nesterov step, outer_lr and momentum 0.9)")


def inner_optimizer(config) -> optax.GradientTransformation:
    """`config.inner_optimizer`, else AdamW (β₁ 0.9, β₂ 0.95, weight decay 0.1) on gradients
    clipped to norm 1, its lr warming up linearly for `warmup_steps`, then a cosine down to 10%
    of `learning_rate` at the last step."""
    if config.inner_optimizer is not None:
        return config.inner_optimizer
    peak, total = config.learning_rate, config.steps
    warmup = min(config.warmup_steps, max(total - 1, 0))
    lr = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(total, warmup + 1), peak / 10)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1))


def outer_nesterov(theta, velocity, delta, lr, mu=0.9):
    """One outer step on the pseudo-gradient Δ (lists of arrays): v ← μv + Δ, θ ← θ − lr(Δ + μv)."""
    velocity = [mu * v + d for v, d in zip(velocity, delta, strict=True)]
    theta = [x - lr * (d + mu * v) for x, d, v in zip(theta, delta, velocity, strict=True)]
    return theta, velocity


def quantize(x, bits: int):
    """What arrives when x is sent in `bits` bits: 32 as is, 16 as bfloat16, fewer as symmetric
    absmax integers in [−q, q] (q = 2^(b−1) − 1) with one fp32 scale per row (the last axis of a
    matrix; a vector is one row)."""
    if bits == 32:
        return x
    if bits == 16:
        return x.astype(jnp.bfloat16).astype(jnp.float32)
    q = 2 ** (bits - 1) - 1
    rows = x.reshape(-1, x.shape[-1]) if x.ndim >= 2 else x.reshape(1, -1)
    scale = jnp.max(jnp.abs(rows), axis=1, keepdims=True) / q
    codes = jnp.clip(jnp.round(rows / jnp.where(scale > 0, scale, 1.0)), -q, q)
    return (codes * scale).reshape(x.shape)


def payload_bytes(leaves, bits: int) -> int:
    """Bytes of those arrays on the wire: ⌈n·b/8⌉ per row of n values, plus its 4-byte scale
    when b ≤ 8."""
    total = 0
    for x in leaves:
        rows, n = (math.prod(x.shape[:-1]), x.shape[-1]) if x.ndim >= 2 else (1, x.size)
        total += rows * (math.ceil(n * bits / 8) + (4 if bits <= 8 else 0))
    return total


def weighted_mean(deltas, weights):
    """Σ_m w_m Δ_m / Σ_m w_m, leaf by leaf (`deltas`: one list of arrays per learner)."""
    w = jnp.asarray(weights, jnp.float32) / np.float32(sum(weights))
    return [sum(w[i] * d[j] for i, d in enumerate(deltas)) for j in range(len(deltas[0]))]


def rda(deltas, weights, eps=1e-12):
    """Radial-Directional Averaging: the weighted mean of the lengths ‖Δ_m‖ times the direction
    of the weighted mean of the unit vectors Δ_m/‖Δ_m‖ (each Δ_m's leaves taken together)."""
    norm = lambda xs: jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in xs))  # noqa: E731
    norms = [norm(d) for d in deltas]
    w = jnp.asarray(weights, jnp.float32) / np.float32(sum(weights))
    radius = sum(w[i] * n for i, n in enumerate(norms))
    units = [[x / jnp.maximum(n, eps) for x in d] for d, n in zip(deltas, norms, strict=True)]
    direction = weighted_mean(units, weights)
    return [radius / jnp.maximum(norm(direction), eps) * u for u in direction]


MEAN_MERGED = ("embed", "pos")  # merged by the weighted mean: only some tokens touch their rows


def split_merge(names, weights, deltas, rda_: bool):
    """Decoupled DiLoCo's merge of one fragment (tensors named `names`): RDA over its tensors
    taken together, the embeddings by the weighted mean (`rda_` False: all by the mean)."""
    mean = weighted_mean(deltas, weights)
    j = [n for n, name in enumerate(names or []) if name not in MEAN_MERGED]
    if rda_ and j:
        for n, d in zip(j, rda([[d[n] for n in j] for d in deltas], weights), strict=True):
            mean[n] = d
    return mean


def balanced_fragments(leaves, count: int) -> list[list[int]]:
    """Split the tensors into `count` fragments of similar size: largest tensor first, each
    into the lightest fragment so far. Returns the leaf indices of each fragment."""
    sizes = [int(np.size(x)) for x in leaves]
    check(1 <= count <= len(sizes), "fragments", count, f"an integer in [1, {len(sizes)}]")
    bins, totals = [[] for _ in range(count)], [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        j = totals.index(min(totals))
        bins[j].append(i)
        totals[j] += sizes[i]
    return [sorted(b) for b in bins]


def first_send(p: int, inner_steps: int, fragments: int) -> int:
    """Fragment p is sent after step ⌊(p+1)·H/P⌋ (in [1, H]) and every H steps after that."""
    return ((p + 1) * inner_steps // fragments - 1) % inner_steps + 1
