"""The syncer's own events in order of time, and its clock.

The actor runtime's syncer handles its events (the asks, the grace deadlines, the answers, each
stamped with the time it reached the syncer, and the publishes) in order of (time, kind), the
simulated clock's order at equal times (`clock.booking`), `hold_s` after their time
(`SyncerRuntime.advance`). `Timers` keeps them on a heap of (time, kind, number, fragment,
data) and keeps the syncer's clock: the time of the latest event handled, which never goes back.

An event can come to the syncer after a later one was handled: an answer stamped with the time
it arrived, but held up longer than `hold_s` before the syncer took it (its Ray call waited for
the lock, or its thread for the CPU). It is then handled at the syncer's clock, not at its own
time (`stamp`: it is *re-stamped*), so the books see it later than it came, out of the order
the simulated clock would have. That is counted, by kind (`restamped`): a run that reports
none handled every event at its own time. Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import collections
import heapq
import itertools

from ..clock.booking import ASK

__all__ = ["Timers"]


class Timers:
    """The syncer's events and its clock (module docstring)."""

    def __init__(self):
        self.heap: list = []  # (time, kind, number, fragment, data)
        self.seq = itertools.count()
        self.clock = 0.0  # the time of the latest event handled
        self.decided = (0.0, ASK)  # every event before this (time, kind) is handled
        self.reached = 0.0  # the latest step boundary a learner is known to be at
        self.restamped: collections.Counter = collections.Counter()  # kind -> events re-stamped

    def push(self, t: float, kind: int, p: int, data=None) -> None:
        """An event of `kind` at t (fragment p, with `data`)."""
        heapq.heappush(self.heap, (t, kind, next(self.seq), p, data))

    def first(self) -> tuple | None:
        """The next event in order, (time, kind, number, fragment, data), left on the heap."""
        return self.heap[0] if self.heap else None

    def pop(self) -> tuple:
        return heapq.heappop(self.heap)

    def of_kind(self, kind: int) -> list[tuple]:
        """The events of `kind` to come (in the heap's order, not sorted)."""
        return [e for e in self.heap if e[1] == kind]

    def reach(self, t: float) -> None:
        """A learner is at a step boundary at t (the end comes no earlier)."""
        self.reached = max(self.reached, t)

    def decide(self, upto: tuple) -> None:
        """Every event before (time, kind) `upto` is handled."""
        self.decided = max(self.decided, upto)

    def stamp(self, t: float, what: str | None = None) -> float:
        """The syncer's clock once an event at t is handled: t, or the clock if it is later (the
        event of kind `what` is then re-stamped, and counted; `what` None: not counted)."""
        if what is not None and t < self.clock:
            self.restamped[what] += 1
        self.clock = max(self.clock, t)
        return self.clock

    def retime(self, when) -> None:
        """Each event moves to `when(t, kind, p, data)` (None: it stays)."""
        for i, (t, kind, seq, p, data) in enumerate(self.heap):
            new = when(t, kind, p, data)
            if new is not None:
                self.heap[i] = (new, kind, seq, p, data)
        heapq.heapify(self.heap)
