"""The books of a run on actors: what happened, booked on a `Recorder` once the run is over.

The learners make no call at most step boundaries (`actors.agent`): each one reports what it
did (every step, answer and apply) with its next answer and at its stop, and the syncer knows
its own events (asks, closes, publishes, failures, rejoins). `Books` gathers both and books
them in the simulated clock's order with the simulated clock's own booking functions
(`clock.booking`, the one booking order: by time; at equal times, by kind; then by learner).
What only the actors need: an answer is too late if its sync's close came before the step
boundary that sent it; a close leaves out the answers to that sync sent before it and not in
it (on the wire); a publish makes the merged fragment the global one for the evaluations that
follow; a learner killed after its last report is booked with the steps its step times give
until the kill (their losses unknown).

The run ends with the budget's last step: what was published after it is booked, and a death
the syncer heard of after it (as on the actors, it is out of the flush), then the flush
(`last_row`) and the last evaluation. Nothing here imports Ray or JAX.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..clock import booking
from ..clock.booking import APPLY, BOUNDARY, END
from ..clock.recorder import Recorder

__all__ = ["Books"]


class Books:
    """The events of one run (module docstring), booked by `book` on a new `Recorder` made by
    `recorder()`; `theta0`: the global fragments at the start (lists of host arrays)."""

    def __init__(self, recorder, M: int, steps: int, eval_at, theta0: list):
        self.recorder, self.M, self.budget = recorder, M, M * steps
        self.evals = sorted(e for e in eval_at if e < steps)
        self.theta0 = [list(f) for f in theta0]
        self.items: list = []  # (time, kind, order, what, data)
        self.seq = itertools.count()
        self.closes: dict = {}  # (fragment, n) -> (time, kind) of that sync's close

    # ---- what happened --------------------------------------------------------------------------
    def learner(self, m: int, report: list) -> None:
        """Learner m's report (`LearnerAgent.report`)."""
        for event in report:
            if event[0] == "step":
                _, t, k, loss, answers, applies = event
                order = (m, next(self.seq))
                self.items.append((t, BOUNDARY, order, "step", (m, k, loss, answers)))
                self.items.append((t, APPLY, order, "apply", (m, applies)))

    def reported(self, m: int, after: float) -> list:
        """Learner m's reported steps after time `after`, in order: ("step", t, k, loss)."""
        return sorted(("step", t, data[1], data[2]) for t, _, _, what, data in self.items
                      if what == "step" and data[0] == m and t > after)

    def syncer(self, t: float, kind: int, what: str, *data) -> None:
        """A syncer's event at t, booked at `kind`'s place among the events of that instant:
        ("close", p, n, weights), ("publish", p, weights, receivers, wait_s, leaves, diag),
        ("fail", m), ("reload", m, peer), ("ask", p), ("kill", m)."""
        if what == "close":
            self.closes[data[:2]] = (t, kind)
        self.items.append((t, kind, (-1, next(self.seq)), what, data))

    # ---- the books ------------------------------------------------------------------------------
    def book(self, end: float | None):
        """Book every event up to the budget's last step at `end` (then only the publishes);
        returns (the recorder, the history rows so far, the losses, the log)."""
        rec, theta = self.recorder(), [list(f) for f in self.theta0]
        rows, losses, log, diags = [], [], [], []
        processed, evals = 0, list(self.evals)
        stop = (end, END) if end is not None else (math.inf, END)
        for t, kind, _, what, data in sorted(self.items, key=lambda i: i[:3]):
            if (t, kind) >= stop and what not in ("publish", "fail"):
                continue  # after the end: what was in flight is published, a death heard of
            if what == "step":
                m, k, loss, answers = data
                booking.step(rec, m, k - 1, t, [  # one sent after its sync closed: too late
                    (p, self.closes.get((p, n), (math.inf,)) < (t, BOUNDARY)) for p, n in answers])
                processed += 1
                losses.append((m, t, loss))
                log += [(t, "answer", m, p) for p, _ in answers]
            elif what == "apply":
                m, applies = data
                booking.apply(rec, m, applies, t)
                log += [(t, "apply", m, p) for p in applies]
                for e in booking.evals_due(evals, processed, self.M):
                    rows.append(self._row(rec, e, t, theta, diags))
                    diags = []
            elif what == "close":
                p, n, weights = data
                booking.close(rec, p, weights, self._on_the_wire(p, n, (t, kind), weights))
                log.append((t, "close", -1, p))
            elif what == "publish":
                p, weights, receivers, wait_s, leaves, diag = data
                booking.publish(rec, p, weights, t, receivers=receivers, wait_s=wait_s)
                theta[p] = list(leaves)
                diags.append((p, False, diag))
                log.append((t, "merge", -1, p))
            elif what == "fail":
                booking.fail(rec, data[0])
                log.append((t, "fail", data[0], -1))
            elif what == "reload":
                booking.reload(rec, data[0], data[1], t)
                log.append((t, "rejoin", data[0], -1))
            else:  # ("ask", p) or ("kill", m): the log only
                log.append((t, what, -1 if what == "ask" else data[0],
                            data[0] if what == "ask" else -1))
        self.state = dict(theta=theta, diags=diags, processed=processed)
        return rec, rows, losses, log

    def last_row(self, rec: Recorder, t: float, flushed: list) -> dict:
        """The last history row, after the flush (`flushed`: (fragment, leaves, diag))."""
        theta, diags = self.state["theta"], self.state["diags"]
        for p, leaves, diag in flushed:
            theta[p] = list(leaves)
            diags.append((p, True, diag))
        processed = self.state["processed"]
        progress = min(self.budget, processed) / self.M
        rec.eval(progress, t, last=True, complete=processed == self.budget)
        return dict(stats=rec.events[-1].stats, diags=diags, fragments=theta)

    # ---- helpers --------------------------------------------------------------------------------
    def _on_the_wire(self, p: int, n: int, at: tuple, weights: dict) -> list[int]:
        """The learners whose answer to sync n of p left before the close (`at`) and is not in
        its merge."""
        out = set()
        for t, kind, _, what, data in self.items:
            if what == "step" and (t, kind) < at and data[0] not in weights and (p, n) in data[3]:
                out.add(data[0])
        return sorted(out)

    def _row(self, rec: Recorder, progress: float, t: float, theta: list, diags: list) -> dict:
        rec.eval(progress, t)
        return dict(stats=rec.events[-1].stats, diags=diags, fragments=[list(f) for f in theta])


def late_s(times: list, timeline, m: int, first: int = 0, start: float = 0.0) -> float:
    """How far behind its step times learner m's last step boundary came (0: on time): its
    boundaries `times` from position `first`, reached at `start`."""
    if not times:
        return 0.0
    planned = start + float(np.sum([timeline.duration(m, k) for k in range(first,
                                                                           first + len(times))]))
    return max(0.0, times[-1] - planned)
