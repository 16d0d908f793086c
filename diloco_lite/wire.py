"""The one wire format: what a b-bit pseudo-gradient looks like on the network, and its size.

`WireFormat(bits)` holds the round trip *and* the byte count, so the two can never disagree,
and the payload it builds is what the compiled program really moves (tests read the HLO):

| bits | codes on the wire                                   | scales                  |
|------|-----------------------------------------------------|-------------------------|
| 32   | the fp32 values                                     | none                    |
| 16   | bfloat16, bit-cast to uint16 (XLA cannot widen it)  | none                    |
| 8    | int8 in [−127, 127]                                 | one fp32 per row        |
| 4    | [−7, 7] + 7, two per uint8 (low nibble first)       | one fp32 per row        |
| 2    | [−1, 1] + 1, four per uint8 (low bits first)        | one fp32 per row        |

Quantization is symmetric absmax (docs/algorithms.md §3, choice): a row is a last-axis slice of a
matrix (a vector or scalar is one row); its scale is s = max|x| / q_max with
q_max = 2^(b−1) − 1, and x travels as round(x / s). Rows whose length does not fill the last
byte are padded with zero codes, and the padding is counted: it is sent.

    wire = WireFormat(4)
    payload = wire.encode(x)        # {"codes": uint8[..., ceil(n/2)], "scales": f32[rows, 1]}
    x_hat = wire.decode(payload, x.shape)
    wire.nbytes(x.shape) == sum(a.nbytes for a in jax.tree.leaves(payload))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from .config import ALLOWED_BITS, check

_PACKED = {4: 2, 2: 4}  # codes per byte for the packed formats


@dataclasses.dataclass(frozen=True)
class WireFormat:
    """b-bit symmetric absmax quantization with one fp32 scale per row (see the module doc)."""

    bits: int = 32

    def __post_init__(self):
        check(self.bits in ALLOWED_BITS and not isinstance(self.bits, bool), "bits", self.bits,
              f"one of {ALLOWED_BITS}")

    @property
    def q_max(self) -> int:
        """The largest code magnitude: 2^(b−1) − 1 (7 for 4 bits, 1 for 2 bits)."""
        return 2 ** (self.bits - 1) - 1

    @property
    def scaled(self) -> bool:
        """Whether rows carry an fp32 scale (every integer format: b ≤ 8)."""
        return self.bits <= 8

    # ---- sizes --------------------------------------------------------------------------------
    def nbytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of one tensor of `shape` on the wire: codes (with row padding) + scales."""
        rows, n = _rows(shape)
        if self.bits >= 16:
            return rows * n * self.bits // 8
        per = _PACKED.get(self.bits, 1)
        return rows * math.ceil(n / per) + 4 * rows

    def tree_nbytes(self, tree: Any) -> int:
        """Bytes of every leaf of a pytree (of arrays or shape-carrying objects)."""
        return sum(self.nbytes(tuple(x.shape)) for x in jax.tree.leaves(tree))

    # ---- the round trip -----------------------------------------------------------------------
    def encode(self, x: jax.Array) -> dict:
        """One fp32 tensor -> its payload `{"codes": ..., "scales": ...}` (scales only if b ≤ 8)."""
        if self.bits == 32:
            return {"codes": x.astype(jnp.float32)}
        if self.bits == 16:
            return {"codes": jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)}
        rows, n = _rows(x.shape)
        x_RxN = x.reshape(rows, n).astype(jnp.float32)
        scale_Rx1 = jnp.max(jnp.abs(x_RxN), axis=1, keepdims=True) / self.q_max
        safe = jnp.where(scale_Rx1 > 0, scale_Rx1, 1.0)
        q_RxN = jnp.clip(jnp.round(x_RxN / safe), -self.q_max, self.q_max).astype(jnp.int32)
        if self.bits == 8:
            return {"codes": q_RxN.astype(jnp.int8), "scales": scale_Rx1}
        per, width = _PACKED[self.bits], self.bits
        u_RxN = q_RxN + self.q_max  # offset codes: 0 .. 2·q_max, fit in `width` bits
        pad = -n % per
        u_RxCxK = jnp.pad(u_RxN, ((0, 0), (0, pad))).reshape(rows, -1, per)
        shifts_K = jnp.arange(per, dtype=jnp.int32) * width
        packed = jnp.sum(u_RxCxK << shifts_K, axis=-1)  # disjoint bits: the sum is an OR
        return {"codes": packed.astype(jnp.uint8), "scales": scale_Rx1}

    def decode(self, payload: dict, shape: tuple[int, ...]) -> jax.Array:
        """A payload -> the fp32 tensor of `shape` the receiver reconstructs."""
        codes = payload["codes"]
        if self.bits == 32:
            return codes.reshape(shape)
        if self.bits == 16:
            return jax.lax.bitcast_convert_type(codes, jnp.bfloat16).astype(jnp.float32).reshape(
                shape)
        rows, n = _rows(shape)
        if self.bits == 8:
            q_RxN = codes.astype(jnp.float32)
        else:
            per, width = _PACKED[self.bits], self.bits
            shifts_K = jnp.arange(per, dtype=jnp.int32) * width
            u_RxCxK = (codes.astype(jnp.int32)[..., None] >> shifts_K) & (2 ** width - 1)
            q_RxN = (u_RxCxK.reshape(rows, -1)[:, :n] - self.q_max).astype(jnp.float32)
        return (q_RxN * payload["scales"]).reshape(shape)

    def round_trip(self, x: jax.Array) -> jax.Array:
        """`decode(encode(x))`: what arrives when x is sent."""
        return self.decode(self.encode(x), x.shape)

    def encode_tree(self, tree: Any) -> Any:
        return jax.tree.map(self.encode, tree)

    def decode_tree(self, payload: Any, like: Any) -> Any:
        """Decode a pytree of payloads into arrays shaped like the leaves of `like`."""
        return jax.tree.map(lambda p, x: self.decode(p, x.shape), payload, like,
                            is_leaf=lambda p: isinstance(p, dict) and "codes" in p)


def to_bytes(tree: Any, batch_dims: int = 1) -> jax.Array:
    """Every leaf of `tree` bit-cast to bytes and laid end to end: `uint8[*lead, total]`, with
    the first `batch_dims` axes (e.g. the learners) kept. One buffer makes one collective where
    a pytree makes one per leaf (a b-bit payload has two leaves per tensor), each paying a
    round of messages on a real link; `from_bytes` undoes it exactly."""
    parts = []
    for x in jax.tree.leaves(tree):
        lead = x.shape[:batch_dims]
        parts.append(jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(lead + (-1,)))
    return jnp.concatenate(parts, axis=-1)


def from_bytes(buf: jax.Array, like: Any, batch_dims: int = 1) -> Any:
    """The pytree `to_bytes` packed, bit for bit: leaves shaped and typed like `like`'s (whose
    first `batch_dims` axes may differ from `buf`'s: e.g. one learner's payload packed, all M
    gathered)."""
    leaves, treedef = jax.tree.flatten(like)
    out, start = [], 0
    lead = buf.shape[:-1]
    for x in leaves:
        shape, size = x.shape[batch_dims:], x.dtype.itemsize
        n = math.prod(shape) * size
        b = buf[..., start:start + n]
        start += n
        if size == 1:
            out.append(jax.lax.bitcast_convert_type(b, x.dtype).reshape(lead + shape))
        else:
            out.append(jax.lax.bitcast_convert_type(b.reshape(lead + shape + (size,)), x.dtype))
    return jax.tree.unflatten(treedef, out)


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, row length): a matrix's leading axes are rows; a vector or scalar is one row."""
    if len(shape) >= 2:
        return math.prod(shape[:-1]), int(shape[-1])
    return 1, int(math.prod(shape))
