"""Decoupled DiLoCo on the simulated clock: learners that never wait, and a syncer per fragment.

Each learner steps at its own pace (`Timeline`) and never blocks. The run ends when the learners
together have processed M × `steps` steps (equal tokens with the lock-step methods): a slow
or failed learner simply does fewer of them. The syncer asks for fragment p at the reference
steps of the one `Schedule` (every H steps of the reference step time t_ref, offsets spread over
the period).

The syncer's decisions live in one state machine, `syncer_state.SyncerState` (its docstring
has the rules: quorum K of the learners up, the grace window, token weights, one version of a
fragment in flight, failures and rejoins, the end-of-run flush). A real runtime drives the same
state machine with wall-clock times; this module is its simulated driver. It keeps the event
queue, each learner's step times and failure windows (`Timeline`), the FIFO timing of the links,
the `Recorder` calls, and the learners' side (docs/algorithms.md §4):

1. asked for fragment p, an up learner answers at its next step boundary: it sends Δ = base − θ
   through the wire format over its own link (first in first out). Δ holds every step since its
   base, so a learner whose previous answer of p was merged answers only once it has applied
   that merge's result (else it would send merged steps again: it answers at the step after);
2. the syncer closes (`SyncerState`), and sends the new fragment down (one FIFO broadcast
   link); it is published when it has arrived;
3. every up learner applies the newest published fragment once it has taken τ steps since the
   ask (never waiting for it): θ ← α·θ + (1−α)·Θ, base ← Θ, its counters of p restart.

A failed learner forgets what it was asked and loses its unsynced work; when it is back it
loads the global fragments and a healthy peer's inner optimizer state, and the open syncs it had
not answered ask it again. At the end, what is in flight is published and the syncer flushes
the rest (plain weighted average, no outer momentum). A run whose learners are all down for
good ends short: its last row says `complete=False`, with a warning. Goodput is booked by what
the merges hold (`recorder`).

With equal speeds, no failures, K = M, τ = 0 (so no grace) and a free link, every ask finds
every learner at the same step, every learner answers at once, and the merge is DiLoCo's (P = 1)
or Streaming DiLoCo's: the tests check it to float tolerance.
"""

from __future__ import annotations

import heapq
import itertools
import math
import warnings

from . import Timeline
from .recorder import Recorder
from .schedule import Schedule
from .syncer_state import Ask, AskAt, Close, SetDeadline, SyncerState, token_weight

# Order of events at equal times: an ask reaches a learner that finishes a step at that very
# time; a step's sends go before the merges of that instant, which go before the arrivals.
ASK, BOUNDARY, RESPONSE, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN, END = range(9)


def plan_decoupled(rec: Recorder, schedule: Schedule, timeline: Timeline, algo, *, steps: int,
                   eval_at: set, tokens_per_step: int) -> None:
    """Record a Decoupled DiLoCo run into `rec` (see the module docstring)."""
    M, P, tau = timeline.learners, schedule.fragments, schedule.overlap
    link, budget = timeline.cluster.link, M * steps
    heap, seq = [], itertools.count()

    def push(t, kind, *data):
        heapq.heappush(heap, (t, kind, next(seq), data))

    up, wi, k = [True] * M, [0] * M, [0] * M  # up; next failure window; own steps done
    asked = [{} for _ in range(M)]  # fragment -> sync asked of m and not answered yet
    ask_pos = [[None] * P for _ in range(M)]  # position at m's first boundary after the ask
    due = [{} for _ in range(M)]  # fragment -> position from which m applies it
    up_free, down_free = [0.0] * M, 0.0
    processed, evals = 0, sorted(e for e in eval_at if e < steps)

    def down_time(p: int, t: float) -> float:
        return max(down_free, t) + link.busy_s(rec.down_nbytes[p]) + link.latency_s

    syncer = SyncerState(algo, M, timeline.t_ref, send_back_s=lambda p, t: down_time(p, t) - t)

    def act(actions: list, t: float) -> None:
        """Carry out the syncer's actions: timers go on the queue, an ask to the learners, a
        close down the link (a `Flush` comes only from `end`: below)."""
        nonlocal down_free
        for a in actions:
            match a:
                case AskAt(p, when):
                    push(when, ASK, p)
                case Ask(p, sync, learners):
                    for m in learners:
                        asked[m][p] = sync
                case SetDeadline(p, sync, when):
                    push(when, DEADLINE, p, sync)
                case Close(p, _, weights, dropped, receivers, wait_s):
                    for m in range(M):
                        asked[m].pop(p, None)
                    for m in dropped:
                        rec.drop(p, m)  # closed without it: its work stays unmerged in m
                    published = down_time(p, t)
                    down_free = published - link.latency_s
                    push(published, PUBLISH, p, weights, receivers, wait_s)

    def start_step(m: int, t: float) -> None:
        end = t + timeline.duration(m, k[m])
        w = timeline.window(m, wi[m])
        push(w[0] if w is not None and w[0] < end else end,
             FAIL if w is not None and w[0] < end else BOUNDARY, m)

    def publish(p: int, weights: dict, receivers: int, wait_s: float, t: float) -> list:
        """Fragment p's new version reached the learners: each up learner applies it τ of its
        own steps after its first step boundary since the ask that came while the sync was open
        (else its next one: one that fell between the close and the publish does not count)."""
        rec.close(p, weights, t, receivers=receivers, wait_s=wait_s)
        for m in range(M):
            if up[m]:
                pos = ask_pos[m][p] if ask_pos[m][p] is not None else rec.position(m) + 1
                due[m][p] = min(due[m].get(p, math.inf), pos + tau)
            ask_pos[m][p] = None
        return syncer.published(p, t)

    for m in range(M):
        start_step(m, 0.0)
    act(syncer.start(), 0.0)
    t = 0.0
    while heap:
        t, kind, _, data = heapq.heappop(heap)
        if kind == ASK:
            act(syncer.ask(data[0], t), t)
        elif kind == BOUNDARY:
            (m,) = data
            if processed == budget:
                continue  # finished at the very instant the budget ran out: not counted
            rec.step(m, k[m], t)
            k[m] += 1
            processed += 1
            for p in sorted(asked[m]):
                if ask_pos[m][p] is None:
                    ask_pos[m][p] = rec.position(m)
                if rec.merged[m][p]:
                    continue  # its last answer was merged and it has not applied the result
                sync, since = asked[m].pop(p), rec.since[m][p]  # >= 1: it has just taken a step
                act(syncer.sent(p, m, sync, since * tokens_per_step, since, t), t)
                rec.send(p, [m], t)
                up_free[m] = max(up_free[m], t) + link.busy_s(rec.up_nbytes[p])
                push(up_free[m] + link.latency_s, RESPONSE, p, m, sync)
            push(t, APPLY, m)
            if processed == budget:
                push(t, END)
        elif kind == RESPONSE:  # an answer the syncer drops was still sent: its bytes are booked
            act(syncer.arrived(*data, t), t)
        elif kind == DEADLINE:
            act(syncer.deadline(*data, t), t)
        elif kind == PUBLISH:
            act(publish(*data, t), t)
        elif kind == APPLY:
            (m,) = data
            for p in [p for p, pos in due[m].items() if rec.position(m) >= pos]:
                rec.arrive(p, [m], t)
                act(syncer.applied(m, p, t), t)
                del due[m][p]
            while evals and processed >= evals[0] * M:
                rec.eval(evals.pop(0), t)
            if processed < budget:
                start_step(m, t)
        elif kind == FAIL:
            (m,) = data
            up[m], asked[m], due[m], ask_pos[m] = False, {}, {}, [None] * P
            rec.fail(m)
            back = timeline.window(m, wi[m])[1]
            wi[m] += 1
            if math.isfinite(back):
                push(back, REJOIN, m)
            act(syncer.failed(m, t), t)
        elif kind == REJOIN:
            (m,) = data
            up[m] = True
            rec.reload(m, next((q for q in range(M) if up[q] and q != m), m), t)
            act(syncer.back(m, t), t)  # asked again by the open syncs it had not answered
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
    for flush in syncer.end(t):
        p = flush.p
        who = {m: token_weight(rec.since[m][p] * tokens_per_step, rec.since[m][p])
               for m in flush.learners if rec.since[m][p] >= 1}
        if who:
            rec.send(p, list(who), t, flush=True)
            rec.close(p, who, t, flush=True)
    rec.eval(min(steps, processed / M), t, last=True, complete=complete)
