"""Decoupled DiLoCo on the simulated clock: learners that never wait, and a syncer per fragment.

Each learner steps at its own pace (`Timeline`) and never blocks. The run ends when the learners
together have processed M × `steps` steps (equal tokens with the lock-step methods): a slow
or failed learner simply does fewer of them. The syncer asks for fragment p at the reference
steps of the one `Schedule` (every H steps of the reference step time t_ref, offsets spread over
the period), then (ALGORITHMS.md §4):

1. each up learner answers at its next step boundary: it sends Δ = base − θ through the wire
   format over its own link (first in first out). Δ holds every step since its base, so a
   learner whose previous answer of p was merged answers only once it has applied that merge's
   result (else it would send merged steps again: it answers at the step after it applies);
2. quorum: the syncer waits for K answers of learners that are up (a failed learner has weight
   0: its answers, even one already on the wire, are dropped; it answers after it is back);
3. grace: then it waits up to g = safety · slack longer, slack = τ·t_ref − (t_quorum + t_sync)
   (t_quorum: time from the ask to the quorum, t_sync: sending the result back), and closes as
   soon as every up learner has answered;
4. it merges the answers with weights w = tokens · (tokens / steps) (quantity × quality, counted
   since each learner's base), takes the outer step, and sends the new fragment down (one FIFO
   broadcast link); it is published when it has arrived;
5. every up learner applies the newest published fragment once it has taken τ steps since the
   ask (never waiting for it): θ ← α·θ + (1−α)·Θ, base ← Θ, its counters of p restart.

The syncer keeps one version of each fragment in flight: its next ask of p comes at the first
scheduled time after the previous version is published. A failed learner is left out of every
merge and loses its unsynced work; when it is back it loads the global fragments and a healthy
peer's inner optimizer state. At the end, each fragment not in flight is merged once more (plain
weighted average, no outer momentum) from the up learners that hold its newest version. A run
whose learners are all down for good ends short: its last row says `complete=False`, with a
warning. Goodput is booked by what the merges hold (`recorder`).

With equal speeds, no failures, K = M, τ = 0 (so no grace) and a free link, every ask finds
every learner at the same step, every learner answers at once, and the merge is DiLoCo's (P = 1)
or Streaming DiLoCo's: the tests check it to float tolerance.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import warnings

from . import Timeline
from .recorder import Recorder
from .schedule import Schedule

# Order of events at equal times: an ask reaches a learner that finishes a step at that very
# time; a step's sends go before the merges of that instant, which go before the arrivals.
ASK, BOUNDARY, RESPONSE, DEADLINE, PUBLISH, APPLY, FAIL, REJOIN, END = range(9)


@dataclasses.dataclass
class _Sync:
    """One open sync of one fragment."""

    id: int
    step: int  # reference step of the ask
    asked: float
    sent: dict = dataclasses.field(default_factory=dict)  # learner -> merge weight
    arrived: set = dataclasses.field(default_factory=set)
    quorum_t: float | None = None
    deadline: float = math.inf


def plan_decoupled(rec: Recorder, schedule: Schedule, timeline: Timeline, algo, *, steps: int,
                   eval_at: set, tokens_per_step: int) -> None:
    """Record a Decoupled DiLoCo run into `rec` (see the module docstring)."""
    M, P, H, tau = timeline.learners, schedule.fragments, schedule.inner_steps, schedule.overlap
    link, t_ref, budget = timeline.cluster.link, timeline.t_ref, M * steps
    heap, seq, ids = [], itertools.count(), itertools.count()
    grid = [0.0]  # reference step k ends at grid[k]: the same sums as an equally fast learner

    def at_step(k: int) -> float:
        while len(grid) <= k:
            grid.append(grid[-1] + t_ref)
        return grid[k]

    def push(t, kind, *data):
        heapq.heappush(heap, (t, kind, next(seq), data))

    up, wi, k = [True] * M, [0] * M, [0] * M  # up; next failure window; own steps done
    life = [0] * M  # failures so far: an answer sent before a failure is dropped
    version, held = [0] * P, [[0] * P for _ in range(M)]
    asked = [set() for _ in range(M)]  # fragments asked of m and not answered yet
    ask_pos = [[None] * P for _ in range(M)]  # position at m's first boundary after the ask
    due = [{} for _ in range(M)]  # fragment -> position from which m applies it
    syncs: list[_Sync | None] = [None] * P
    up_free, down_free = [0.0] * M, 0.0
    processed, evals = 0, sorted(e for e in eval_at if e < steps)

    def start_step(m: int, t: float) -> None:
        end = t + timeline.duration(m, k[m])
        w = timeline.window(m, wi[m])
        push(w[0] if w is not None and w[0] < end else end,
             FAIL if w is not None and w[0] < end else BOUNDARY, m)

    def weight(m: int, p: int) -> float:
        tokens = rec.since[m][p] * tokens_per_step
        return tokens * (tokens / rec.since[m][p])

    def down_time(p: int, t: float) -> float:
        return max(down_free, t) + link.busy_s(rec.down_nbytes[p]) + link.latency_s

    def maybe_close(p: int, t: float, deadline: bool = False) -> None:
        """Close fragment p's sync if it has its quorum and either nobody up is still to answer
        or the grace window is over (`deadline`: answers of that very instant are in)."""
        nonlocal down_free
        s = syncs[p]
        if s is None or s.quorum_t is None:
            return
        waiting = [m for m in range(M) if up[m] and (p in asked[m] or m in set(s.sent) -
                                                     s.arrived)]
        if waiting and not deadline:
            return
        for m in range(M):
            asked[m].discard(p)
        for m in set(s.sent) - s.arrived:
            rec.drop(p, m)  # closed without it: its work stays unmerged in the learner
        published = down_time(p, t)
        down_free = published - link.latency_s
        weights = {m: s.sent[m] for m in sorted(s.arrived)}
        push(published, PUBLISH, p, weights, sum(up), s.quorum_t - s.asked)
        syncs[p] = None
        nxt = s.step + H
        while at_step(nxt) <= published:
            nxt += H
        push(at_step(nxt), ASK, p, nxt)

    def publish(p: int, weights: dict, receivers: int, wait: float, t: float) -> None:
        rec.close(p, weights, t, receivers=receivers, wait_s=wait)
        version[p] += 1
        for m in range(M):
            if up[m]:
                pos = ask_pos[m][p] if ask_pos[m][p] is not None else rec.position(m) + 1
                due[m][p] = min(due[m].get(p, math.inf), pos + tau)
            ask_pos[m][p] = None

    for m in range(M):
        start_step(m, 0.0)
    for p in range(P):
        push(at_step(schedule.offset(p)), ASK, p, schedule.offset(p))
    t = 0.0
    while heap:
        t, kind, _, data = heapq.heappop(heap)
        if kind == ASK:
            p, step = data
            syncs[p] = _Sync(next(ids), step, t)
            for m in range(M):
                asked[m].add(p)
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
                syncs[p].sent[m] = weight(m, p)  # since[m][p] >= 1: it has just taken a step
                rec.send(p, [m], t)
                up_free[m] = max(up_free[m], t) + link.busy_s(rec.up_nbytes[p])
                push(up_free[m] + link.latency_s, RESPONSE, p, m, syncs[p].id, life[m])
                asked[m].discard(p)
            push(t, APPLY, m)
            if processed == budget:
                push(t, END)
        elif kind == RESPONSE:
            p, m, sid, lived = data
            s = syncs[p]
            if s is None or s.id != sid or lived != life[m]:
                continue  # closed without it, or it failed since (its bytes were sent: booked)
            s.arrived.add(m)
            if s.quorum_t is None and len(s.arrived) >= algo.quorum:
                s.quorum_t = t
                slack = tau * t_ref - ((t - s.asked) + (down_time(p, t) - t))
                s.deadline = t + (algo.grace_safety * slack if slack > 0 else 0.0)
                push(s.deadline, DEADLINE, p, sid)
            maybe_close(p, t)
        elif kind == DEADLINE:
            p, sid = data
            if syncs[p] is not None and syncs[p].id == sid and t >= syncs[p].deadline:
                maybe_close(p, t, deadline=True)
        elif kind == PUBLISH:
            publish(*data, t)
        elif kind == APPLY:
            (m,) = data
            for p in [p for p, pos in due[m].items() if rec.position(m) >= pos]:
                if version[p] > held[m][p]:
                    rec.arrive(p, [m], t)
                    held[m][p] = version[p]
                del due[m][p]
            while evals and processed >= evals[0] * M:
                rec.eval(evals.pop(0), t)
            if processed < budget:
                start_step(m, t)
        elif kind == FAIL:
            (m,) = data
            up[m], due[m], ask_pos[m] = False, {}, [None] * P
            life[m] += 1
            rec.fail(m)
            back = timeline.window(m, wi[m])[1]
            wi[m] += 1
            if math.isfinite(back):
                push(back, REJOIN, m)
            for p in range(P):
                s = syncs[p]
                if s is not None:  # weight 0: out of the merge and of the quorum
                    s.sent.pop(m, None)
                    s.arrived.discard(m)
                    if s.quorum_t is not None and len(s.arrived) < algo.quorum:
                        s.quorum_t, s.deadline = None, math.inf
                maybe_close(p, t)
        elif kind == REJOIN:
            (m,) = data
            up[m] = True
            rec.reload(m, next((q for q in range(M) if up[q] and q != m), m), t)
            held[m] = list(version)
            start_step(m, t)
        else:  # END
            break
    complete = processed == budget
    if not complete:
        warnings.warn(f"Decoupled DiLoCo: every learner is down for good after {processed} of "
                      f"{budget} learner-steps, so the run ends short (at step "
                      f"{processed / M:g} of {steps}; its last history row says complete=False)",
                      RuntimeWarning, stacklevel=2)
    _finish(rec, heap, publish, up, held, version, weight, P, M, t, min(steps, processed / M),
            complete)


def _finish(rec, heap, publish, up, held, version, weight, P, M, t, progress, complete) -> None:
    """End of the run: publish what is in flight, flush the rest, evaluate."""
    in_flight = set()
    for when, kind, _, data in sorted(heap):
        if kind == PUBLISH:
            publish(*data, when)
            in_flight.add(data[0])
            t = max(t, when)
    for p in range(P):
        who = {m: weight(m, p) for m in range(M)
               if up[m] and rec.since[m][p] >= 1 and held[m][p] == version[p]}
        if p not in in_flight and who:
            rec.send(p, list(who), t, flush=True)
            rec.close(p, who, t, flush=True)
    rec.eval(progress, t, last=True, complete=complete)
