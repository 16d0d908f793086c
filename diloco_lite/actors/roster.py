"""What the syncer of the actor runtime knows of its learners, between their reports.

The learners make no call at most step boundaries (`actors.agent`), so `Roster` keeps, for
each learner: its last reported (position, time) and where its process began, its step times
(`Timeline`) to tell where it is now (`position`), its share of the budget (`stop`,
`actors.budget`: shared out again when a learner goes down or comes back, with a "stop"
message to each learner whose share changed), the messages it was sent (`heard`), and which
process of it is current (`life`: a report of an earlier one is void). A learner killed after
its last report went on as its rules and step times say until the kill: `lost_report` replays
its rules (a shadow `LearnerAgent`) on the messages it was sent. The end (`end`) is the time of
the last step of all, once every learner up has stopped at its share. Its messages go through
the syncer's `Mailbox` (`actors.mailbox`: which process is current, the numbering). Nothing here
imports Ray or JAX.
"""

from __future__ import annotations

import math

from .agent import LearnerAgent
from .budget import shares, steps_until
from .mailbox import Mailbox

__all__ = ["Roster"]


class Roster:
    """M learners of `fragments` fragments, overlap `tau`, at `timeline`'s step times, spending
    `budget` learner-steps; `outbox`: the `Mailbox` its messages go through (a list: a new
    `Mailbox` that puts them on it)."""

    def __init__(self, timeline, fragments: int, tau: int, budget: int, outbox):
        self.timeline, self.M, self.P, self.tau = timeline, timeline.learners, fragments, tau
        self.budget, M = budget, self.M
        self.mail = outbox if isinstance(outbox, Mailbox) else Mailbox(M, outbox)
        self.anchors = [(0, 0.0)] * M  # (position, time) each learner steps on from; time None:
        # down
        self.stop, self.predicted_end = shares(timeline, self.anchors, budget)
        self.last = [(0, 0.0)] * M  # each learner's last reported (position, time)
        self.final: dict = {}  # learner -> (position, held versions): it stopped there
        self.killed_at: dict = {}
        self.gone: set = set()  # learners down for good
        self.starts = [(0, [0] * fragments, -math.inf)] * M  # each process's (position,
        # versions held, time) where it began

    @property
    def life(self) -> list[int]:
        """Which process of each learner is the current one (`Mailbox.life`)."""
        return self.mail.life

    @property
    def heard(self) -> list[list]:
        """The messages sent to each learner's current process (`Mailbox.heard`)."""
        return self.mail.heard

    # ---- what the syncer hears ------------------------------------------------------------------
    def started(self, m: int, messages: list, k: int = 0, versions=None, t: float = -math.inf,
                now: float = 0.0) -> list:
        """A process of learner m begins at position k (versions held, time t) with `messages`
        (its stop is added); returns them (the messages sent to it later are numbered from there
        on: `Mailbox.send`)."""
        self.starts[m] = (k, list(versions) if versions is not None else [0] * self.P, t)
        self.killed_at.pop(m, None)  # (a kill while it was down)
        if t > -math.inf:
            self.restop(m, (k, t), now)
        return self.mail.begin(m, list(messages) + [("stop", self.stop[m])])

    def reported(self, m: int, report: list) -> None:
        for event in report:
            if event[0] == "step":
                self.last[m] = (event[2], event[1])
        self.predicted_end = self._predicted_end()

    def killed(self, m: int, t: float, now: float, for_good: bool) -> None:
        """The driver killed learner m at t: it takes no more steps. A kill of a learner down
        already (a new process still starting, killed again, before or after the syncer heard
        of the first death) changes nothing here: the process it knew stopped before."""
        if for_good:
            self.gone.add(m)
        if m in self.killed_at or self.anchors[m][1] is None:
            return
        self.killed_at[m] = t
        self.restop(m, (self.position(m, t)[0], None), now)

    def failed(self, m: int, t: float, now: float, reported: list) -> list:
        """Learner m's process died (heard of at t): what it did after its last report (its
        reported steps since its process began: `reported`)."""
        self.final.pop(m, None)
        lost = self.lost_report(m, self.killed_at.pop(m, t), reported)
        self.mail.replace(m)
        self.restop(m, (self.last[m][0], None), now)
        return lost

    # ---- where the learners are -----------------------------------------------------------------
    def lost_report(self, m: int, kill: float, reported: list) -> list:
        """What learner m did from its last report to its kill at `kill`, as its rules (on the
        messages it was sent) and its step times say (its losses unknown)."""
        k, versions, _ = self.starts[m]
        shadow = LearnerAgent(m, self.P, self.tau, k=k, versions=versions)
        for message in self.heard[m]:
            shadow.hear(message)
        for _, t, _, loss in reported:
            shadow.boundary(t, loss)
        shadow.take_report()
        since = max(self.last[m], (k, self.starts[m][2]), key=lambda a: a[1])  # (or it began)
        for _, t in steps_until(self.timeline, m, since, kill):
            if shadow.stopped:
                break
            shadow.boundary(t, math.nan)
            self.last[m] = (shadow.k, t)
        return shadow.take_report()

    def restop(self, m: int, anchor: tuple, now: float, margin: float = 0.0) -> None:
        """Learner m goes on from `anchor`, (position, time; time None: it is down). The budget
        is shared out again from `now`; no learner up stops before a step it may already be in
        (`margin`: how far behind real time `now` may be)."""
        self.anchors[m] = anchor
        going = [self.anchors[q][1] is not None for q in range(self.M)]
        anchors = [self.position(q, now) if going[q] else self.anchors[q] for q in range(self.M)]
        floor = [min(self.stop[q], self.position(q, now + margin + self.timeline.nominal[q])[0])
                 if going[q] and q != m else 0 for q in range(self.M)]
        stop, _ = shares(self.timeline, anchors, self.budget, floor)
        for q in range(self.M):
            if stop[q] != self.stop[q] and going[q] and q != m:
                self.mail.send(q, ("stop", stop[q]))
        self.stop = stop
        self.predicted_end = self._predicted_end()

    def position(self, m: int, t: float) -> tuple[int, float]:
        """Learner m's (position, time of that boundary) at t, from its anchor and its last
        report, at its step times (none after its stop)."""
        steps = [s for s in steps_until(self.timeline, m, self._anchor(m), t)
                 if s[0] <= self.stop[m]]
        return steps[-1] if steps else self._anchor(m)

    def end(self, up: list) -> float | None:
        """The time of the last step of all, once every learner up has stopped at its share and
        their steps spend the budget (or every learner down is down for good: the run ends
        short); None before."""
        if not all(self.final.get(m, (None,))[0] == self.stop[m] for m in range(self.M) if up[m]):
            return None
        taken = sum(self.last[m][0] for m in range(self.M))
        if taken >= self.budget or all(up[m] or m in self.gone for m in range(self.M)):
            return max(self.last[m][1] for m in range(self.M))
        return None

    def processed(self, up: list, now: float) -> int:
        """The learner-steps taken by now, as far as the syncer can tell."""
        return min(self.budget, sum(self.position(m, now)[0] if up[m] else self.last[m][0]
                                    for m in range(self.M)))

    # ---- helpers --------------------------------------------------------------------------------
    def _predicted_end(self) -> float | None:
        """When the learners up reach their stops, at their step times (None: none is up)."""
        ends = []
        for q in range(self.M):
            if self.anchors[q][1] is None:
                continue
            k, at = self._anchor(q)
            ends.append(at + sum(self.timeline.duration(q, j) for j in range(k, self.stop[q])))
        return max(ends, default=None)

    def _anchor(self, m: int) -> tuple[int, float]:
        """Learner m's latest known (position, time): its last report or where it (re)started."""
        a = self.anchors[m]
        return max(self.last[m], a, key=lambda x: x[1]) if a[1] is not None else self.last[m]
