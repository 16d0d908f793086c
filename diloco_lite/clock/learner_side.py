"""One learner's side of Decoupled DiLoCo: what it does at its step boundaries, from what it has
heard. One copy of these rules for both clocks: `LearnerRules` holds one `LearnerSide` per
learner, on the simulated clock and in the actor runtime's syncer (`actors.syncer`, which each
learner asks at its step boundaries). The rules need only what the learner has heard, so a
learner's own process could run them instead.

What a learner hears, and when (docs/algorithms.md §4):

- an **ask** for fragment p (`ask`): at the ask's time. The syncer asks on the reference clock
  at times it knows in advance (the first asks at the start, each later one once the previous
  version is published), so on the actor runtime an ask is announced before it comes;
- a **publish** of fragment p (`published`): the merged fragment has reached every learner up;
  the same message tells it that the sync is closed and whether its own answer is in the merge.

The rules:

1. asked for p, it answers at its next step boundary with Δ = base − θ, every step since its
   base (`boundary` returns those answers). Not while its previous answer of p was merged and
   that merge's result is not applied yet (it would send merged steps again): it answers at its
   first boundary after applying. It answers until it hears of the close (the publish): an
   answer sent after the close is too late (the syncer leaves it out);
2. it applies the newest published p once it has taken τ of its own steps since its first step
   boundary after the ask (if it had one before the publish; else since its next one), never
   waiting for it (`apply`, at a step boundary);
3. down (`failed`), it forgets what it was asked and was to apply; back (`back`), it holds every
   newest Θ_p, with no step since.
"""

from __future__ import annotations

import math


class LearnerSide:
    """One learner's rules (module docstring) over `fragments` fragments with overlap `tau`."""

    def __init__(self, fragments: int, tau: int):
        self.P, self.tau = fragments, tau
        self.k = 0  # steps done: the data index of its next step, and its position
        self.since = [0] * fragments  # per fragment: its steps since its base
        self.merged = [False] * fragments  # its last answer merged, the result not applied yet
        self.asked: dict[int, int] = {}  # fragment -> the sync it was asked for, not answered
        self.ask_pos: list[int | None] = [None] * fragments  # its first boundary after the ask
        self.due: dict[int, int] = {}  # fragment -> the position from which it applies it

    def ask(self, p: int, sync: int) -> None:
        """Asked for fragment p, sync `sync`."""
        self.asked[p] = sync

    def boundary(self) -> list[tuple[int, int, int]]:
        """It finished a step: the answers it sends now, [(fragment, sync, steps in Δ)] (rule 1)."""
        self.k += 1
        self.since = [n + 1 for n in self.since]
        out = []
        for p in sorted(self.asked):
            if self.ask_pos[p] is None:
                self.ask_pos[p] = self.k
            if self.merged[p]:
                continue  # its Δ still holds merged steps: it answers once it has applied
            out.append((p, self.asked.pop(p), self.since[p]))
        return out

    def published(self, p: int, merged: bool, position: int | None = None) -> None:
        """Fragment p's sync closed and its merge is published (`merged`: its own answer is in
        it); `position`: its steps done at the publish (None: now). Sets when it applies it
        (rule 2)."""
        at = self.k if position is None else position
        pos = self.ask_pos[p] if self.ask_pos[p] is not None else at + 1
        self.due[p] = min(self.due.get(p, math.inf), pos + self.tau)
        self.ask_pos[p] = None
        self.asked.pop(p, None)
        self.merged[p] = self.merged[p] or merged

    def apply(self) -> list[int]:
        """At a step boundary: the fragments it applies now (rule 2)."""
        now = [p for p, pos in self.due.items() if self.k >= pos]
        for p in now:
            del self.due[p]
            self.since[p], self.merged[p] = 0, False
        return now

    def failed(self) -> None:
        """It went down (rule 3)."""
        self.asked, self.due, self.ask_pos = {}, {}, [None] * self.P
        self.merged = [False] * self.P

    def back(self) -> None:
        """It is back, holding every newest Θ_p (rule 3)."""
        self.since, self.merged = [0] * self.P, [False] * self.P
