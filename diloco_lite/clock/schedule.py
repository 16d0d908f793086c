"""The one schedule of when each fragment is sent: used by every training method, the bandwidth
simulator and the notebooks.

Steps are counted from 1: "after step t" means once t inner steps are done. Fragment p of P is
first sent after step `offset(p)` = ⌊(p+1)·H/P⌋ and then every H steps, so the P fragments are
spread evenly over the period and the last one goes on the H-th step (docs/algorithms.md §3). Its
new global value is applied τ (`overlap`) steps later, after step t + τ.

| method                     | H              | P          | τ         |
|----------------------------|----------------|------------|-----------|
| DDP                        | 1              | 1          | 0         |
| DiLoCo                     | `inner_steps`  | 1          | 0         |
| Streaming / Decoupled      | `inner_steps`  | `fragments`| `overlap` |

DiLoCo is the special case P = 1, τ = 0 of Streaming DiLoCo's schedule (it sends everything
after steps H, 2H, …), and DDP the special case H = 1. Decoupled DiLoCo's syncer asks for
fragment p at the same reference steps, on the simulated clock (`clock.syncer`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..config import DDP, DecoupledDiLoCo, DiLoCo, StreamingDiLoCo, check, check_int


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Fragment p sends after steps offset(p), offset(p) + H, …; it arrives τ steps later."""

    inner_steps: int = 1
    fragments: int = 1
    overlap: int = 0

    def __post_init__(self):
        check_int("Schedule.inner_steps", self.inner_steps, 1)
        check_int("Schedule.fragments", self.fragments, 1)
        check_int("Schedule.overlap", self.overlap, 0, self.inner_steps - 1)

    @classmethod
    def of(cls, algorithm) -> Schedule:
        """The schedule of an algorithm config (table in the module docstring)."""
        if isinstance(algorithm, DDP):
            return cls(1, 1, 0)
        if isinstance(algorithm, DiLoCo):
            return cls(algorithm.inner_steps, 1, 0)
        allowed = "an instance of DDP, DiLoCo, StreamingDiLoCo or DecoupledDiLoCo"
        check(isinstance(algorithm, (StreamingDiLoCo, DecoupledDiLoCo)), "algorithm", algorithm,
              allowed)
        return cls(algorithm.inner_steps, algorithm.fragments, algorithm.overlap)

    def offset(self, p: int) -> int:
        """The first step after which fragment p is sent, in [1, H]."""
        h, n = self.inner_steps, self.fragments
        return ((p + 1) * h // n - 1) % h + 1

    def sends_after(self, t: int) -> list[int]:
        """The fragments sent after step t (t ≥ 1)."""
        return [p for p in range(self.fragments)
                if t >= 1 and (t - self.offset(p)) % self.inner_steps == 0]

    def send_steps(self, p: int, steps: int) -> range:
        """Every step ≤ `steps` after which fragment p is sent."""
        return range(self.offset(p), steps + 1, self.inner_steps)

    def phases(self) -> tuple[np.ndarray, np.ndarray]:
        """(0-based steps within one period at which something is sent, the fraction of the
        fragments sent at each), for the bandwidth simulator's periodic model."""
        steps0 = np.array([(self.offset(p) - 1) % self.inner_steps
                           for p in range(self.fragments)])
        phases, counts = np.unique(steps0, return_counts=True)
        return phases, counts / self.fragments
