"""Symmetric absmax quantization to b ∈ {32, 16, 8, 4} bits, and its exact byte count.

Choice (ALGORITHMS.md §3): one fp32 scale per *row* — per last-axis slice of a matrix, one per
vector/scalar tensor. A value x in a row with scale s = max|x| / q_max is sent as the integer
round(x / s) in [−q_max, q_max], q_max = 2^(b−1) − 1 (7 for 4 bits). 16 bits is sent as
bfloat16 (no scale); 32 bits is sent as is. The receiver dequantizes and accumulates in fp32.

Here the transmitted integers are simulated in fp32 (quantize → dequantize in one function);
`comm.payload_bytes` counts what a real link would carry: values × b/8 + 4 bytes per scale.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def scale_count(shape: tuple[int, ...]) -> int:
    """Number of fp32 scales for a tensor of `shape` (one per row; one for a vector/scalar)."""
    return math.prod(shape[:-1]) if len(shape) >= 2 else 1


def fake_quantize(x: jax.Array, bits: int) -> jax.Array:
    """x after a round trip through the b-bit wire format, in fp32."""
    if bits >= 32:
        return x
    if bits == 16:
        return x.astype(jnp.bfloat16).astype(x.dtype)
    q_max = 2 ** (bits - 1) - 1
    axis = -1 if x.ndim >= 2 else None
    scale = jnp.max(jnp.abs(x), axis=axis, keepdims=True) / q_max
    safe = jnp.where(scale > 0, scale, 1.0)
    return jnp.clip(jnp.round(x / safe), -q_max, q_max) * safe


def fake_quantize_tree(tree, bits: int):
    """`fake_quantize` on every leaf of a pytree."""
    return jax.tree.map(lambda x: fake_quantize(x, bits), tree)
