"""Where each learner stops: the budget of M × steps learner-steps, shared out in time order.

On the simulated clock the run ends when the learners together have taken M × `steps` steps,
counted in the order they finish (at equal times, by learner). The learners of the actor
runtime make no call at most step boundaries, so the syncer shares the budget out in advance
from their step times (`Timeline`): learner m steps from `anchors[m]` = (its position, the time
it reached it) on, one `Timeline.duration` after the other; a learner down (time None) takes
no more. `stops` returns the position at which each learner stops. The syncer recomputes it when a
learner goes down or comes back, from what it then knows (`floor`: no learner stops before a
position it may already have passed; a learner back near the end may then get fewer steps than
on the simulated clock).

What the syncer does when a learner runs behind its clock (a step that takes longer than its
step time): nothing changes here. The learner still stops at its position, so the run still
takes exactly the budget's tokens, only later; and the syncer still asks on the reference clock
(the learner answers each ask with the steps it has), as on the simulated clock. The runtime
reports each learner's lag (`actors.booking`: `late_s`).
"""

from __future__ import annotations

import heapq

__all__ = ["shares", "steps_until", "stops"]


def stops(timeline, anchors: list, budget: int, floor: list | None = None) -> list[int]:
    """Each learner's stop position (module docstring). `anchors[m]`: (position, time) of
    learner m, or (position, None) when it is down; `floor[m]`: the least position learner m
    may be given."""
    return shares(timeline, anchors, budget, floor)[0]


def shares(timeline, anchors: list, budget: int, floor: list | None = None):
    """(`stops`, the time of the budget's last step: None if the learners up cannot spend it)."""
    pos = [a[0] for a in anchors]
    heap = [(t + timeline.duration(m, k), m) for m, (k, t) in enumerate(anchors) if t is not None]
    heapq.heapify(heap)
    taken, last = sum(pos), None  # the steps of a learner down count as taken
    while heap and taken < budget:
        last, m = heapq.heappop(heap)
        pos[m] += 1
        taken += 1
        heapq.heappush(heap, (last + timeline.duration(m, pos[m]), m))
    return [max(p, f) for p, f in zip(pos, floor or pos, strict=True)], last


def steps_until(timeline, m: int, anchor: tuple, t: float) -> list[tuple[int, float]]:
    """Learner m's step boundaries after `anchor` (position, time) up to t (a boundary at t
    included), at its step times: [(position reached, time)]."""
    k, at = anchor
    out = []
    while at is not None and at + timeline.duration(m, k) <= t:
        at += timeline.duration(m, k)
        k += 1
        out.append((k, at))
    return out
