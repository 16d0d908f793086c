"""One learner on the wall clock: what it does at each step boundary, decided where it runs.

A learner needs the syncer only at its asks, answers and applies, and all of them are known to
it in advance: the syncer announces each ask (its time on the reference clock) with the
publish of the version before, and it sends a publish's notice at the close, before the merge
is computed: the time it counts from (the time the clock charges for the reply to reach the
last learner), whether the learner's own answer is in the merge, and the next ask (the reply's
bytes follow once merged). So the learner needs no call at its step boundaries: `LearnerAgent`
runs the one copy of the learner's rules (`clock.learner_side.LearnerSide`) on what it has heard,
each message at the time it counts from, in the simulated clock's order at equal times (an ask
before the step boundary of that instant; a publish after it, before the applies). It keeps a
report of what it did (every step: its time, its loss, its answers and applies), which travels
with its next answer (and at its stop), so that the syncer can book the run (`actors.booking`).
A message can come after the time it counts from: the notice of a close just before one of
the learner's step boundaries arrives `hold_s` and a message's latency after the close. So at a
step boundary where such a message could change what it does (`unsure`: a fragment asked by
then whose publish it has not heard, and it would answer now, or apply now if the publish came
by now, or a next ask could be due by now), the learner first asks the syncer for everything
up to its boundary's time (`SyncerRuntime.until`), and waits for it: the syncer answers once it
has handled every event up to that time. At every other step boundary it makes no call. A
message heard late is taken as of its time (`published(position=...)`).

The syncer tells it where to stop (`stop`): the budget of M × steps learner-steps is shared
out by the learners' step times (`actors.budget`). Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import itertools
import math

from ..clock.learner_side import LearnerSide
from ..clock.syncer import ASK, BOUNDARY, PUBLISH

__all__ = ["LearnerAgent"]


class LearnerAgent:
    """Learner m's rules on the wall clock (module docstring): `fragments` fragments, overlap
    `tau`. `hear` takes the syncer's messages; `boundary` says what to do at a step boundary."""

    def __init__(self, m: int, fragments: int, tau: int, *, k: int = 0,
                 versions: list | None = None, period_s: float = 0.0):
        self.m, self.tau = m, tau
        self.period = period_s  # H · t_ref: the least time from one ask of a fragment to its next
        self.side = LearnerSide(fragments, tau)
        self.side.k = k  # a learner back from a failure goes on with its data index
        self.times: list[float] = []  # its step boundaries since it (re)started
        self.first = k  # its position before the first of them
        self.inbox: list = []  # (time, kind, seq, message): what it will have heard by then
        self.seq = itertools.count()
        self.held = list(versions) if versions is not None else [0] * fragments
        self.heard = list(self.held)  # the newest version of each fragment it has heard of
        self.report: list = []  # what it did since its last report
        self.asks = [(-1, math.inf)] * fragments  # the newest ask heard of each: (n, its time)
        self.closed = [-1] * fragments  # the newest sync of each whose publish it has heard
        self.stop_at: int | None = None

    @property
    def k(self) -> int:
        return self.side.k

    def hear(self, message: tuple) -> None:
        """A message of the syncer: ("ask", t, p, n) the n-th ask of fragment p comes at t;
        ("publish", t, p, n, merged, next) the n-th sync of p is closed and its merge published
        at t (`merged`: its own answer is in it), the next ask at `next`; ("stop", position)
        where to stop; ("reply", p, n): that merge's bytes, the program's business."""
        kind = message[0]
        if kind == "reply":
            return
        if kind == "stop":
            self.stop_at = message[1]
        elif kind == "ask":
            heapq.heappush(self.inbox, (message[1], ASK, next(self.seq), message))
            _, t, p, n = message
            self.asks[p] = max(self.asks[p], (n, t), key=lambda a: a[0])
        elif kind == "publish":
            heapq.heappush(self.inbox, (message[1], PUBLISH, next(self.seq), message))
            _, _, p, n, _, at = message
            self.closed[p] = max(self.closed[p], n)
            self.hear(("ask", at, p, n + 1))
        else:
            raise ValueError(f"learner {self.m}: unknown message {message!r}")

    def boundary(self, t: float, loss: float) -> tuple[list, list]:
        """It finished a step at t with `loss`: (answers [(fragment, n, steps in Δ)], [(fragment,
        version)] to apply now: the newest published); both go into its report."""
        self._take((t, BOUNDARY))  # asks until now, publishes before now
        answers = self.side.boundary()
        self.times.append(t)
        self._take((t, PUBLISH + 1))  # publishes of this very instant
        applies = self.side.apply()
        for p in applies:
            self.held[p] = self.heard[p]
        self.report.append(("step", t, self.k, loss, [(p, n) for p, n, _ in answers],
                            list(applies)))
        return answers, [(p, self.held[p]) for p in applies]

    def unsure(self, t: float) -> bool:
        """Whether a message not heard yet could change what it does at its step boundary at t:
        for a fragment asked by then whose publish it has not heard, it would answer now (a
        publish before now would close it), or apply now if the publish came by now (rule 2),
        or the next ask could be due by now (one reference period after this one) and it would
        answer it. Then it asks the syncer for everything up to t first (module docstring)."""
        side = copy.deepcopy(self.side)  # its rules, as they stand at the boundary (a copy)
        for at, kind, _, message in sorted(self.inbox):
            if (at, kind) >= (t, BOUNDARY):
                break
            if kind == ASK:
                side.ask(message[2], message[3])
            else:
                side.published(message[2], message[4], position=self.position_at(at))
        after = side.k + 1  # its position once this step is counted
        for p, (n, asked) in enumerate(self.asks):
            if asked > t or self.closed[p] >= n:
                continue  # no sync of p open by then, as far as it knows
            if p in side.asked and not side.merged[p]:
                return True  # it would answer now, unless the sync closed before
            first = side.ask_pos[p] if side.ask_pos[p] is not None else after
            if first + self.tau <= after:
                return True  # it would apply now, if the publish came by now
            if not side.merged[p] and t >= asked + self.period - 1e-9:
                return True  # the next ask could be due (the reference clock's sums round)
        return False

    @property
    def stopped(self) -> bool:
        """It has reached its stop position."""
        return self.stop_at is not None and self.k >= self.stop_at

    def uploaded(self, t: float) -> None:
        """It uploaded its inner optimizer state at its step boundary t (for a returning peer)."""
        self.report.append(("upload", t, self.k))

    def take_report(self) -> list:
        out, self.report = self.report, []
        return out

    def position_at(self, t: float) -> int:
        """Its steps done at time t (a step boundary at t counts)."""
        return self.first + bisect.bisect_right(self.times, t)

    def _take(self, until: tuple) -> None:
        while self.inbox and self.inbox[0][:2] < until:
            t, kind, _, message = heapq.heappop(self.inbox)
            if kind == ASK:
                _, _, p, n = message
                self.side.ask(p, n)
            else:
                _, _, p, n, merged, _ = message
                self.side.published(p, merged, position=self.position_at(t))
                self.heard[p] = max(self.heard[p], n + 1)
