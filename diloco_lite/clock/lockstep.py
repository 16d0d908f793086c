"""Lock-step methods on the simulated clock: DDP, DiLoCo and Streaming DiLoCo.

Every sync is a barrier. The exchange of fragment p after step t starts when the last up worker
has finished step t (`release`), holds the link for what the collective moves per worker (DDP's
all-reduce: 2(M−1)/M of the gradient; DiLoCo's and Streaming's all-gather: M−1 payloads, first
in first out), arrives one link latency per ring hop later (`clock.exchange_cost`), and must
have arrived before anyone starts step t + τ + 1. Between syncs
each worker runs at its own speed, so one slow worker sets everyone's pace.

Failures (choice, like data-parallel training in notebook 06):
- default: the whole job stops. When the failed worker is back, every worker restarts from the
  last sync (the checkpoint) and redoes the steps since. The redo sees the same data in the same
  order, so it changes the clock, not the parameters: the plan books the time and the lost
  steps, and the device runs each step once. A worker that never comes back is an error.
- `elastic=True`: the others drop the failed worker and go on (its unsynced work is lost); once
  it is back it rejoins at the next sync, loading the global parameters and a healthy peer's
  inner optimizer state (DDP: its batch share simply returns).

End of a run: after the last step and its due arrivals, each fragment that is not in flight
and holds unsynced work is merged once more by plain averaging (outer SGD with lr 1, no momentum:
no extra Nesterov extrapolation), so the final global parameters contain every step's work;
fragments in flight keep the value their sync already computed. DiLoCo runs whose length is a
multiple of H end on a sync and need no flush. The flush is booked in `comm_bytes`, not in the
per-step peak.
"""

from __future__ import annotations

import math

from ..config import check
from . import Timeline, exchange_cost
from .recorder import Recorder
from .schedule import Schedule

MAX_RESTARTS_PER_STEP = 100


def plan_lockstep(rec: Recorder, schedule: Schedule, timeline: Timeline, *, steps: int,
                  elastic: bool, ddp: bool, eval_at: set) -> None:
    """Record a lock-step run of `steps` steps into `rec` (see the module docstring)."""
    M, link, tau = timeline.learners, timeline.cluster.link, schedule.overlap
    factor, hops = exchange_cost(M, gather=not ddp)
    fin, up, wi = [0.0] * M, [True] * M, [0] * M  # free at; up; next failure window
    back: dict[int, float] = {}  # elastic: failed worker -> when it is up again
    gate: dict[int, float] = {}  # step -> when the syncs due after it have arrived
    pending: list[tuple[int, int]] = []  # (due step, fragment) of syncs in flight
    link_free = 0.0
    ckpt = dict(mark=rec.mark(), t=0, gate={}, pending=[])
    restarts, t = 0, 0

    def exchange(p: int, release: float) -> float:
        nonlocal link_free
        link_free = max(link_free, release) + link.busy_s(factor * rec.up_nbytes[p])
        return link_free + hops * link.latency_s

    while t < steps:
        t += 1
        if elastic and not any(up):  # everyone is down: the first one back starts alone
            m0 = min(back, key=back.get)
            check(math.isfinite(back[m0]), "Cluster.failures", timeline.cluster.failures,
                  f"windows that leave a worker to finish the run (after step {t - 1} of "
                  f"{steps} every worker is down for good)")
            fin[m0], up[m0] = back.pop(m0), True
            rec.reload(m0, m0, fin[m0])
        g = gate.get(t - 1, 0.0)
        end = {m: max(fin[m], g) + timeline.duration(m, t - 1) for m in range(M) if up[m]}
        if not elastic:
            hit = _first_failure(timeline, wi, max(end.values()))
            if hit is not None:  # the job stops, and restarts from the checkpoint
                restart = _restart_time(timeline, wi, hit)
                check(math.isfinite(restart), "Cluster.failures", timeline.cluster.failures,
                      "windows that end (a lock-step job waits forever for a worker that never "
                      "comes back: use elastic=True or DecoupledDiLoCo)")
                restarts += 1
                check(restarts <= MAX_RESTARTS_PER_STEP * steps, "Cluster.failures",
                      timeline.cluster.failures, "rare enough that a lock-step round can finish")
                rec.rollback(ckpt["mark"])
                rec.wasted(sum(e <= hit[1][0] for e in end.values()))  # done before it failed
                t, fin = ckpt["t"], [restart] * M
                gate, pending = dict(ckpt["gate"]), list(ckpt["pending"])
                continue
        else:
            for m in list(end):
                w = timeline.window(m, wi[m])
                if w is not None and w[0] < end[m]:  # fails during this step
                    up[m], back[m] = False, w[1]
                    wi[m] += 1
                    rec.fail(m)
                    del end[m]
        for m, e in end.items():
            rec.step(m, t - 1, e)
            fin[m] = e
        now = max([fin[m] for m in range(M) if up[m]] + [0.0])
        sends = schedule.sends_after(t) if end else []
        for p in sends:
            # every worker that took this step sends: its Δ holds ≥ 1 step since its base, as
            # the schedule keeps arrivals (τ < H steps after a send) before the next send of p
            # (tests/test_booking.py checks it on the plans)
            who = list(end)
            arrival = exchange(p, now)
            weights = dict.fromkeys(who, 1.0)
            if ddp:  # the all-reduce is part of the step itself
                rec.close(p, weights, arrival, upload=True, bytes_at=now)
            else:
                rec.send(p, who, now)
                rec.close(p, weights, arrival)
            gate[t + tau] = max(gate.get(t + tau, 0.0), arrival)
            pending.append((t + tau, p))
        for p in [p for due, p in pending if due == t]:
            if not ddp:
                rec.arrive(p, [m for m in range(M) if up[m]], max(now, gate[t]))
        pending = [x for x in pending if x[0] > t]
        if elastic and sends:
            _rejoin(rec, up, fin, back, timeline, wi, now, max(now, gate.get(t, 0.0)))
        if t in eval_at and t < steps:
            rec.eval(t, max(now, gate.get(t, 0.0)))
        if sends and not elastic:
            ckpt = dict(mark=rec.mark(), t=t, gate=dict(gate), pending=list(pending))
    # the run is done when its steps are and every sync still in flight has landed
    now = max([fin[m] for m in range(M) if up[m]] + [gate.get(steps, 0.0)])
    done = max([now] + [gate[due] for due, _ in pending])
    if not ddp:
        in_flight = {p for _, p in pending}
        for p in range(schedule.fragments):
            who = [m for m in range(M) if up[m] and rec.since[m][p] >= 1]
            if p not in in_flight and who:
                rec.send(p, who, now, flush=True)
                done = max(done, exchange(p, now))
                rec.close(p, dict.fromkeys(who, 1.0), done, flush=True)
    rec.eval(steps, done, last=True)


def _first_failure(timeline: Timeline, wi: list, before: float):
    """(learner, window) of the earliest failure that starts before `before`, or None."""
    best = None
    for m in range(timeline.learners):
        w = timeline.window(m, wi[m])
        if w is not None and w[0] < before and (best is None or w[0] < best[1][0]):
            best = (m, w)
    return best


def _restart_time(timeline: Timeline, wi: list, hit) -> float:
    """When every worker is up again after failure `hit` (failures meanwhile are absorbed)."""
    m, (_, restart) = hit
    wi[m] += 1
    changed = True
    while changed and math.isfinite(restart):
        changed = False
        for w_m in range(timeline.learners):
            w = timeline.window(w_m, wi[w_m])
            if w is not None and w[0] <= restart:
                restart, changed = max(restart, w[1]), True
                wi[w_m] += 1
    return restart


def _rejoin(rec, up, fin, back, timeline, wi, release: float, start: float) -> None:
    """Elastic: workers back by this sync reload and start the next step with the others."""
    for m in sorted(back):
        if back[m] > release:
            continue
        w = timeline.window(m, wi[m])
        if w is not None and w[0] <= release:  # failed again before it could rejoin
            back[m] = w[1]
            wi[m] += 1
            continue
        peer = next(q for q in range(len(up)) if up[q])
        up[m], fin[m] = True, start
        del back[m]
        rec.reload(m, peer, start)
