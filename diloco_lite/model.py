"""A small decoder-only character transformer in Flax NNX, and its loss as a pure function.

The NNX module is only the *definition*. Algorithms see a plain pytree of parameters (a nested
dict of arrays, from `nnx.split(...)` then `to_pure_dict()`), so that `jit`, `vmap`,
`shard_map`, optax and our byte counter all work on ordinary arrays. `Model.apply` rebuilds the
module from the pytree inside the traced function.

Shapes in names: B batch, L sequence length, D model width, V vocabulary, H heads, K head size.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .config import ModelConfig, check

Params = Any  # nested dict of arrays


class Block(nnx.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, h = cfg.d_model, cfg.n_heads
        self.n_heads = h
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        # No bias on q, k, v: a key bias adds the same constant to every score of a row, which
        # the softmax ignores, so its gradient is exactly zero and AdamW would turn float
        # rounding there into full-size steps. (Query/value biases are dropped with it.)
        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, rngs=rngs)
        self.proj = nnx.Linear(d, d, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, cfg.mlp_ratio * d, rngs=rngs)
        self.down = nnx.Linear(cfg.mlp_ratio * d, d, rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        b, n, d = x_BxLxD.shape  # n = L
        h = self.n_heads
        qkv = self.qkv(self.ln1(x_BxLxD)).reshape(b, n, 3, h, d // h)
        q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores_BxHxLxL = jnp.einsum("blhk,bmhk->bhlm", q_BxLxHxK, k_BxLxHxK) / jnp.sqrt(d // h)
        causal_LxL = jnp.tril(jnp.ones((n, n), dtype=bool))
        scores_BxHxLxL = jnp.where(causal_LxL, scores_BxHxLxL, -1e9)
        attn_BxHxLxL = jax.nn.softmax(scores_BxHxLxL, axis=-1)
        out_BxLxHxK = jnp.einsum("bhlm,bmhk->blhk", attn_BxHxLxL, v_BxLxHxK)
        x_BxLxD = x_BxLxD + self.proj(out_BxLxHxK.reshape(b, n, d))
        return x_BxLxD + self.down(jax.nn.gelu(self.up(self.ln2(x_BxLxD))))


class Transformer(nnx.Module):
    """Token + learned position embeddings, `n_layers` blocks, final norm, tied output head."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.pos = nnx.Param(init(rngs.params(), (cfg.context, cfg.d_model)))
        # One attribute per block (not a list) keeps the pytree paths readable: block_0, block_1…
        self.n_layers = cfg.n_layers
        for i in range(cfg.n_layers):
            setattr(self, f"block_{i}", Block(cfg, rngs=rngs))
        self.ln_f = nnx.LayerNorm(cfg.d_model, rngs=rngs)

    def __call__(self, tokens_BxL: jax.Array) -> jax.Array:
        x_BxLxD = self.embed(tokens_BxL) + self.pos[: tokens_BxL.shape[1]]
        for i in range(self.n_layers):
            x_BxLxD = getattr(self, f"block_{i}")(x_BxLxD)
        return self.embed.attend(self.ln_f(x_BxLxD))  # logits_BxLxV, tied embeddings


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: compiled steps key on it
class Model:
    """The pure-function view of a `Transformer`: `init(seed) -> params`, `apply(params, x)`."""

    cfg: ModelConfig
    graphdef: Any
    template: Any  # nnx.State with the right structure, used to rebuild the module

    def init(self, seed: int = 0) -> Params:
        state = nnx.split(Transformer(self.cfg, rngs=nnx.Rngs(seed)))[1]
        to_pure = getattr(nnx, "to_pure_dict", None)  # flax >= 0.12; older: the State method
        return to_pure(state) if to_pure is not None else state.to_pure_dict()

    def apply(self, params: Params, tokens_BxL: jax.Array) -> jax.Array:
        state = jax.tree.map(lambda x: x, self.template)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)(tokens_BxL)

    def loss(self, params: Params, batch_BxL1: jax.Array) -> jax.Array:
        """Mean next-character cross-entropy; `batch[:, :-1]` predicts `batch[:, 1:]`."""
        return loss_and_accuracy(self, params, batch_BxL1)[0]


@functools.cache  # one Model per config, so that runs of one config share compiled steps
def build_model(cfg: ModelConfig) -> Model:
    """Abstract-initialize the transformer (no FLOPs) and return its pure-function view."""
    check(cfg.vocab_size is not None, "ModelConfig.vocab_size", None, "set (use the corpus's)")
    graphdef, template = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    return Model(cfg=cfg, graphdef=graphdef, template=template)


def loss_and_accuracy(model: Model, params: Params, batch_BxL1: jax.Array):
    """(mean cross-entropy, next-character accuracy) on one batch of `seq_len + 1` tokens."""
    nll_BxL, correct_BxL = token_nll_and_correct(model, params, batch_BxL1)
    return jnp.mean(nll_BxL), jnp.mean(correct_BxL)


def token_nll_and_correct(model: Model, params: Params, batch_BxL1: jax.Array):
    """Per predicted token: the cross-entropy and whether the argmax is right (bool),
    `[B, seq_len]` each; `batch[:, :-1]` predicts `batch[:, 1:]`."""
    inputs_BxL, targets_BxL = batch_BxL1[:, :-1], batch_BxL1[:, 1:]
    logits_BxLxV = model.apply(params, inputs_BxL).astype(jnp.float32)
    logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
    nll_BxL = -jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    return nll_BxL, jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL


def depth_order(params: Params) -> list[int]:
    """Indices of the leaves of `params` in forward (depth) order: the embeddings, then block 0,
    block 1, … (numerically: block_10 after block_9), then the final norm. `jax.tree.leaves` order
    is alphabetical instead (block_0, block_1, block_10, block_2, …, embed, ln_f, pos)."""
    paths = [tuple(str(getattr(k, "key", k)) for k in path)
             for path, _ in jax.tree_util.tree_leaves_with_path(params)]

    def depth(i: int):
        top = paths[i][0]
        block = re.fullmatch(r"block_(\d+)", top)
        if top in ("embed", "pos"):
            return 0, 0, paths[i]
        return (1, int(block[1]), paths[i]) if block else (2, 0, paths[i])

    return sorted(range(len(paths)), key=depth)


def count_params(params: Params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def model_flops_per_token(cfg: ModelConfig, seq_len: int, n_params: int) -> float:
    """Training FLOPs per token: 6·N for the weights plus 12·layers·L·D for attention (fwd+bwd)."""
    return 6.0 * n_params + 12.0 * cfg.n_layers * seq_len * cfg.d_model
