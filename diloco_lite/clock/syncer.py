"""Decoupled DiLoCo on the simulated clock: learners that never wait, and a syncer per fragment.

Each learner steps at its own pace (`Timeline`) and never blocks. The run ends when the learners
together have processed M × `steps` steps (equal tokens with the lock-step methods): a slow
or failed learner simply does fewer of them. The syncer asks for fragment p at the reference
steps of the one `Schedule` (every H steps of the reference step time t_ref, offsets spread over
the period).

The syncer's decisions live in one state machine, `syncer_state.SyncerState` (its docstring
has the rules: quorum K of the learners up, the grace window, token weights, one version of a
fragment in flight, failures and rejoins, the end-of-run flush), and the learners' side in
`learner_rules.LearnerRules` (when a learner answers and applies, what a rejoin loads, the
flush's weights). A real runtime drives the same two with wall-clock times
(`actors.syncer`); this module is their simulated driver: the event queue, each learner's
step times and failure windows (`Timeline`), and the FIFO timing of the links (docs/algorithms.md
§4):

1. an answer goes through the wire format from the learner's host to the syncer's (`Links`:
   each host's sending and receiving sides first in first out, so the M answers of a sync
   queue on the syncer's receiving side) and reaches the syncer when it has arrived;
2. a closed sync's merged fragment (the reply, in `down_bits`) goes to each learner up, one
   copy after the other from the syncer's host; it is published when the last has arrived,
   and that message also tells the learners that the sync is closed;
3. at equal times an ask reaches a learner that finishes a step at that very time; a step's
   answers go before the merges of that instant, which go before the learners' applies (the
   booking order, `clock.booking`, which the actor runtime's books follow too).

A failed learner is back at its window's end. At the end, what is in flight is published and
the syncer flushes the rest (plain weighted average, no outer momentum). A run whose learners
are all down for good ends short: its last row says `complete=False`, with a warning. Goodput
is booked by what the merges hold (`recorder`).

With equal speeds, no failures, K = M, τ = 0 (so no grace) and a free link, every ask finds
every learner at the same step, every learner answers at once, and the merge is DiLoCo's (P = 1)
or Streaming DiLoCo's: the tests check it to float tolerance.
"""

from __future__ import annotations

import heapq
import itertools
import math
import warnings

from . import Links, Timeline
from .booking import APPLY, ASK, BOUNDARY, DEADLINE, END, FAIL, PUBLISH, REJOIN, RESPONSE, evals_due
from .learner_rules import LearnerRules
from .recorder import Recorder
from .schedule import Schedule
from .syncer_state import AskAt, Close, SetDeadline, SyncerState

# (the order of events at equal times, ASK … END, is the booking order's: `clock.booking`)
__all__ = ["APPLY", "ASK", "BOUNDARY", "DEADLINE", "END", "FAIL", "PUBLISH", "REJOIN", "RESPONSE",
           "plan_decoupled"]


def plan_decoupled(rec: Recorder, schedule: Schedule, timeline: Timeline, algo, *, steps: int,
                   eval_at: set, tokens_per_step: int) -> None:
    """Record a Decoupled DiLoCo run into `rec` (see the module docstring)."""
    M = timeline.learners
    link, budget = timeline.cluster.link, M * steps
    heap, seq = [], itertools.count()

    def push(t, kind, *data):
        heapq.heappush(heap, (t, kind, next(seq), data))

    wi = [0] * M  # each learner's next failure window
    links = Links(link, M)
    processed, evals = 0, sorted(e for e in eval_at if e < steps)

    def reply(p: int, t: float, book: bool) -> float:
        """When fragment p's merge, closed at t, reaches the last learner up."""
        to = [m for m in range(M) if syncer.up[m]]
        return max(links.fan_out(to, rec.down_nbytes[p], t, book=book), default=t)

    def on_action(a, t: float) -> None:
        """The syncer's timers go on the queue; a close goes to the learners up."""
        match a:
            case AskAt(p, when):
                push(when, ASK, p)
            case SetDeadline(p, sync, when):
                push(when, DEADLINE, p, sync)
            case Close(p, _, weights, _, _, wait_s):
                to = tuple(m for m in range(M) if syncer.up[m])
                push(reply(p, t, book=True), PUBLISH, p, weights, to, wait_s)

    syncer = SyncerState(algo, M, timeline.t_ref,
                         reply_s=lambda p, t: reply(p, t, book=False) - t)
    rules = LearnerRules(syncer, rec, tau=schedule.overlap, tokens_per_step=tokens_per_step,
                         on_action=on_action)

    def start_step(m: int, t: float) -> None:
        end = t + timeline.duration(m, rules.k[m])
        w = timeline.window(m, wi[m])
        push(w[0] if w is not None and w[0] < end else end,
             FAIL if w is not None and w[0] < end else BOUNDARY, m)

    def publish(p: int, weights: dict, receivers: tuple, wait_s: float, t: float) -> None:
        rules.published(p, weights, t, receivers=receivers, wait_s=wait_s)

    for m in range(M):
        start_step(m, 0.0)
    rules.start()
    t = 0.0
    while heap:
        t, kind, _, data = heapq.heappop(heap)
        if kind == ASK:
            rules.ask(data[0], t)
        elif kind == BOUNDARY:
            (m,) = data
            if processed == budget:
                continue  # finished at the very instant the budget ran out: not counted
            processed += 1
            for p, sync in rules.boundary(m, t):
                push(links.send(m + 1, 0, rec.up_nbytes[p], t), RESPONSE, p, m, sync)
            push(t, APPLY, m)
            if processed == budget:
                push(t, END)
        elif kind == RESPONSE:  # an answer the syncer drops was still sent: its bytes are booked
            rules.arrived(*data, t)
        elif kind == DEADLINE:
            rules.deadline(*data, t)
        elif kind == PUBLISH:
            publish(*data, t)
        elif kind == APPLY:
            (m,) = data
            rules.apply(m, t)
            for e in evals_due(evals, processed, M):
                rec.eval(e, t)
            if processed < budget:
                start_step(m, t)
        elif kind == FAIL:
            (m,) = data
            back = timeline.window(m, wi[m])[1]
            wi[m] += 1
            if math.isfinite(back):
                push(back, REJOIN, m)
            rules.failed(m, t)
        elif kind == REJOIN:
            (m,) = data
            rules.back(m, rules.peer(m), t)  # asked again by the open syncs it had not answered
            start_step(m, t)
        else:  # END
            break
    complete = processed == budget
    if not complete:
        warnings.warn(f"Decoupled DiLoCo: every learner is down for good after {processed} of "
                      f"{budget} learner-steps, so the run ends short (at step "
                      f"{processed / M:g} of {steps}; its last history row says complete=False)",
                      RuntimeWarning, stacklevel=2)
    # The end: publish what is in flight, flush the rest, evaluate.
    for when, kind, _, data in sorted(heap):
        if kind == PUBLISH:
            publish(*data, when)  # (its next ask would come after the end)
            t = max(t, when)
    end = t
    for p, weights in rules.flushes(t):
        rules.flushed(p, weights, t)
        for m in weights:  # its Δ through learner m's link and the syncer's: the run ends
            end = max(end, links.send(m + 1, 0, rec.up_nbytes[p], t))  # once all are in
    rec.eval(min(steps, processed / M), end, last=True, complete=complete)
