"""Reading the bytes a compiled program moves: `collective_bytes(jitted_fn, *args)`.

What the methods *book* comes from the one wire format (`wire.WireFormat(bits).nbytes`): every
value at b bits (packed, row padding included) plus one fp32 scale per row for b ≤ 8. The tests
hold that booking equal to what this module reads in the optimized HLO:

- `collective_bytes(jitted_fn, *args)` compiles the function and reads every collective op with
  the bytes of its result shape (tuple-shaped, i.e. combined, ops are summed over their
  elements). For an all-reduce the result is exactly the payload each device contributes; for an
  all-gather it is the gathered array: every device's payload (the learner methods' sync
  all-gathers the b-bit payloads, so its result is what all the learners sent: `comm_bytes`).
  An op inside a loop body is counted once, as it appears in the program.
- A ring all-reduce moves 2(M−1)/M of the payload per worker on the wire; the bandwidth
  simulator applies that factor, the training history (bytes sent) does not.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
# `%name = <shape> all-reduce(...)` or the async form `all-reduce-start(...)` (the `-done` half
# carries no new payload and is skipped).
_OP_RE = re.compile(
    r"=\s*(?P<shape>\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\("
)
_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    kind: str  # "all-reduce", "all-gather", ...
    bytes: int  # bytes of the op's result shape (summed over the tuple for combined ops)
    shape: str  # the HLO result shape text


def shape_bytes(shape_text: str) -> int:
    """Bytes of an HLO shape such as `f32[64,3]{1,0}` or `(f32[8], bf16[2,2])`."""
    total = 0
    for dtype, dims in _ARRAY_RE.findall(shape_text):
        if dtype not in _DTYPE_BYTES:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _DTYPE_BYTES[dtype]
    return total


def collectives_in_hlo(hlo_text: str) -> list[CollectiveOp]:
    """Every collective op in an HLO module's text, in program order."""
    return [
        CollectiveOp(kind=m["op"], bytes=shape_bytes(m["shape"]), shape=m["shape"])
        for m in _OP_RE.finditer(hlo_text)
    ]


def collective_bytes(jitted_fn, *args, **kwargs) -> dict[str, Any]:
    """Compile `jitted_fn(*args)` and return its collectives: `{"ops": [...], "by_kind": {...},
    "total": int}`; `by_kind` maps e.g. "all-reduce" to its summed bytes."""
    hlo = jitted_fn.lower(*args, **kwargs).compile().as_text()
    ops = collectives_in_hlo(hlo)
    by_kind = Counter()
    for op in ops:
        by_kind[op.kind] += op.bytes
    return {"ops": ops, "by_kind": dict(by_kind), "total": sum(by_kind.values())}
