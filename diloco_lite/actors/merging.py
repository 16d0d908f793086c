"""The syncer's merges in the actor runtime, and the end of the run.

A close makes a `Merge` job: its answers' payloads, the learners up at the close (one reply
each) and the learners told of it (its publish notice: those up at the close, and any back
since, `actors.rejoins`). `Merges` keeps the jobs: the syncer's thread takes each one
(`next`), computes it off the lock (`compute`: no lock needed, as fragment p has one version
in flight) and hands it back (`merged`): Θ_p is the new one and every process told of it gets
the reply's bytes (through the `Mailbox`); the publish waits for it
(`SyncerRuntime.advance`).

`End` is the end: the budget's last step is known once every learner up has reported its stop
(`check`); then, once no merge is left to compute or publish, `plan` books the run and plans the
flush, each fragment's flush is booked as it is merged (`booked`), and `result` gives the
history rows, the losses, the log and the recorded plan. Nothing here imports Ray.
"""

from __future__ import annotations

import dataclasses
import math

from ..clock import booking
from ..clock.learner_rules import flush_weights

__all__ = ["End", "Merge", "Merges"]


@dataclasses.dataclass
class Merge:
    """A closed sync to merge (or, `flush`, a fragment of the end's flush)."""

    p: int
    n: int  # the sync's number among fragment p's
    weights: dict  # learner -> weight
    receivers: tuple  # the learners up at the close: one reply each
    wait_s: float
    payloads: dict  # learner -> bytes
    flush: bool = False
    closed_at: float = 0.0
    published_at: float = 0.0  # when the clock's links deliver the last reply
    next_ask: float = math.inf
    result: tuple | None = None  # (Θ_p leaves, diagnostics), once merged
    reply: object = None  # the reply's bytes, once merged
    told: dict = dataclasses.field(default_factory=dict)  # learner -> its process (life) that
    # has the publish notice: the reply goes to each


class Merges:
    """The closed syncs to merge, in the order closed, and those being computed, on `theta`
    (`SyncerParams`); the replies go through `mail` (`Mailbox`)."""

    def __init__(self, theta, mail):
        self.theta, self.mail = theta, mail
        self.queue: list[Merge] = []  # closed, to compute
        self.computing = 0  # handed out (`next`), not merged yet

    def add(self, job: Merge) -> None:
        """A sync closed: its merge is to compute."""
        self.queue.append(job)

    def next(self) -> Merge | None:
        """The next closed sync to merge; `merged` it when done."""
        if not self.queue:
            return None
        self.computing += 1
        return self.queue.pop(0)

    @property
    def busy(self) -> bool:
        """A merge is queued or being computed."""
        return bool(self.queue) or self.computing > 0

    def compute(self, job: Merge):
        """The merge of a closed sync, or of the flush (no lock needed: fragment p has one
        version in flight); hand its result to `merged`."""
        return self.theta.merge(job.p, job.weights, job.payloads, job.flush)

    def merged(self, job: Merge, result) -> None:
        """The merge is computed: Θ_p is the new one, and every process told of it gets its reply
        (the publish notice went at the close, or at its rejoin)."""
        diag = self.theta.take(job.p, result)
        job.result, job.reply = (result[0], diag), result[3]
        if job.flush:
            return
        self.computing -= 1
        for m, life in job.told.items():
            self.mail.send_to(m, life, ("reply", job.p, job.n), job.reply)

    def tell(self, job: Merge, m: int) -> None:
        """Learner m's current process has `job`'s publish notice: it gets the reply, at once if
        merged already."""
        job.told[m] = self.mail.life[m]
        if job.reply is not None:
            self.mail.send(m, ("reply", job.p, job.n), job.reply)


class End:
    """The end of a run booked by `books` (`Books`), whose learners are in `roster`; a
    learner-step is `tokens` tokens (module docstring)."""

    def __init__(self, books, roster, tokens: int):
        self.books, self.roster, self.tokens = books, roster, tokens
        self.at: float | None = None  # the time of the budget's last step, once known
        self.done: float | None = None  # the flush's time, once planned
        self.flushed: list = []  # (fragment, Θ_p leaves, diagnostics) of the flush
        self.booked_run: tuple | None = None  # (recorder, rows, losses, log) up to the end

    def check(self, up: list) -> bool:
        """Whether the budget's last step has just become known (every learner up has stopped at
        its share, `Roster.end`)."""
        if self.at is not None:
            return False
        self.at = self.roster.end(up)
        return self.at is not None

    def plan(self, state) -> list[Merge]:
        """Book the run up to the end and plan the flush (once nothing is left to merge or
        publish): the learners of `state` (`SyncerState`) holding a fragment's newest version
        have applied it by the flush; returns the flush's `Merge` jobs (payloads to fill in)."""
        self.booked_run = rec, _, _, log = self.books.book(self.at)
        t = max([self.at] + [e[0] for e in log if e[1] == "merge"])
        for m, (_, held) in self.roster.final.items():
            for p, v in enumerate(held):
                if state.up[m] and v == state.version[p]:
                    state.applied(m, p, t)
        self.done = t
        return [Merge(p, -1, who, (), 0.0, {}, flush=True)
                for p, who in flush_weights(state.end(t), rec.since, self.tokens)]

    def booked(self, job: Merge) -> None:
        """The flush of `job`, merged: booked."""
        booking.flush(self.booked_run[0], job.p, job.weights, self.done)
        self.flushed.append((job.p, *job.result))

    def result(self, leaves) -> dict:
        """The history rows (stats, diagnostics, Θ: `leaves(fragments)` gives its leaves), the
        losses, the log and the recorded plan."""
        if self.done is None:
            raise RuntimeError("result() before the flush is planned (a merge is left, or the "
                               "learners have not all stopped): call flushes() until it plans")
        rec, rows, losses, log = self.booked_run
        last = self.books.last_row(rec, self.done, self.flushed)
        rows = [{**r, "params": leaves(r.pop("fragments"))} for r in rows + [last]]
        return dict(rows=rows, losses=losses, log=sorted(log, key=lambda e: e[0]),
                    plan=rec.finish())
