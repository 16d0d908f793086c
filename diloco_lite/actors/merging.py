"""The syncer's merges in the actor runtime, and the end of the run.

A close makes a `Merge` job: its answers' payloads, the learners up at the close (one reply
each) and the learners told of it (its publish notice: those up at the close, and any back
since, `actors.rejoins`). The syncer's thread takes each job (`next_merge`), computes it off the
lock (`merge`: no lock needed, as fragment p has one version in flight) and hands it back
(`merged`): Θ_p is the new one and every learner told gets the reply's bytes; the publish
waits for it (`SyncerRuntime.advance`).

The end: the budget's last step is known once every learner up has reported its stop
(`_check_end`); an answer that reached the syncer after it but that the clock's link would
have carried by then counts as arrived then (`_by_the_end`). Then `flushes()` (once no merge is
left to compute or publish) books the run and plans the flush, `flush` merges each fragment's
flush, and `result()` gives the history rows, the losses, the log and the recorded plan.
Part of `actors.syncer.SyncerRuntime` (a mixin: its state lives there). Nothing here imports
Ray.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from ..clock.learner_rules import book_flush, flush_weights
from ..clock.syncer import PUBLISH, RESPONSE

__all__ = ["Merge", "Merges"]


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
    """`SyncerRuntime`'s merges and end (module docstring)."""

    def next_merge(self) -> Merge | None:
        """The next closed sync to merge; `merged` it when done."""
        if not self.merges:
            return None
        self.merging += 1
        return self.merges.pop(0)

    @property
    def busy(self) -> bool:
        """A merge is queued or being computed."""
        return bool(self.merges) or self.merging > 0

    def merge(self, job: Merge):
        """The merge of a closed sync, or of the flush (no lock needed: fragment p has one
        version in flight); hand its result to `merged`."""
        return self.theta.merge(job.p, job.weights, job.payloads, job.flush)

    def merged(self, job: Merge, result) -> None:
        """The merge is computed: Θ_p is the new one, and every learner told of it gets its reply
        (the publish notice went at the close, or at its rejoin)."""
        diag = self.theta.take(job.p, result)
        job.result, job.reply = (result[0], diag), result[3]
        if job.flush:
            return
        self.merging -= 1
        for m, life in job.told.items():
            if life == self.roster.life[m]:
                self.roster.send(m, ("reply", job.p, job.n), job.reply)

    def flushes(self) -> list | None:
        """At the end (every learner up has stopped; call again until it says otherwise): the
        fragments to flush and the learners whose Δ each takes (`Merge` jobs without payloads
        yet); None while a merge is left to compute or publish."""
        if self.end is None:
            return None
        self.advance(math.inf)
        if self.busy or any(kind == PUBLISH for _, kind, *_ in self.timers):
            return None
        self.flushing = True
        self.rec, self.rows, self.losses, self.log = self.books.book(self.end)
        t = max([self.end] + [e[0] for e in self.log if e[1] == "merge"])
        for m, (_, held) in self.roster.final.items():
            for p, v in enumerate(held):
                if self.up[m] and v == self.state.version[p]:
                    self.state.applied(m, p, t)
        self.done = t
        return [Merge(p, -1, who, (), 0.0, {}, flush=True)
                for p, who in flush_weights(self.state.end(t), self.rec.since, self.tokens)]

    def flush(self, job: Merge) -> None:
        """The flush of `job` (its payloads in), merged and booked."""
        self.merged(job, self.merge(job))
        book_flush(self.rec, job.p, job.weights, self.done)
        self.flushed.append((job.p, *job.result))

    def result(self) -> dict:
        """The history rows (stats, diagnostics, Θ), the losses, the log and the recorded plan."""
        if self.done is None:
            raise RuntimeError("result() before the flush is planned (a merge is left, or the "
                               "learners have not all stopped): call flushes() until it plans")
        last = self.books.last_row(self.rec, self.done, self.flushed)
        rows = [{**r, "params": self._leaves(r.pop("fragments"))} for r in self.rows + [last]]
        return dict(rows=rows, losses=self.losses, log=sorted(self.log, key=lambda e: e[0]),
                    plan=self.rec.finish(), params=self.theta.params())

    # ---- helpers --------------------------------------------------------------------------------
    def _check_end(self) -> None:
        if self.end is None:
            self.end = self.roster.end(self.up)
            if self.end is not None:
                self._by_the_end()

    def _by_the_end(self) -> None:
        """An answer that arrived after the end, but that the clock's link would have carried by
        then (sent by the end: on loopback's free link, at once), counts as arrived then."""
        link = self.timeline.cluster.link
        for i, (t, kind, seq, p, data) in enumerate(self.timers):
            if kind == RESPONSE and t > self.end:
                sent = data[3] + link.busy_s(self.theta.nbytes(p)) + link.latency_s
                if sent <= self.end:
                    self.timers[i] = (sent, kind, seq, p, data)
        heapq.heapify(self.timers)
