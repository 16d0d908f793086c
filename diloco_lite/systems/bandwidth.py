"""Compute utilization over one network link, and the bandwidth needed to reach a target.

A discrete-event model of training steps (docs/algorithms.md §5, "Bandwidth needed"), in numpy,
vectorized over cases (bandwidths, model sizes, step times, targets). Choices, all explicit:

- **Step.** Compute time T per step: forward T/3, then backward 2T/3. Stalls push every later
  step back; utilization = compute / (compute + stall).
- **Release.** A sync's payload leaves as the backward pass of its step produces it, in
  `buckets` equal buckets; bucket j is ready when the j-th slice of the backward pass ends.
  This holds for DDP's gradients and (choice) for the outer gradients too: the last inner step's
  per-layer update is applied as its gradient appears, and fragments are spread over depth.
- **Link.** One FIFO link of B Gbit/s (1e9 bit/s) per replica; `latency_s` is added once to
  each sync's arrival (one message, not 2(R-1) ring hops) and does not occupy the link.
- **Payload** (bits on this link per sync) = fraction of parameters x bits x route factor.
  Bits: `grad_bits` (default 16, bf16: the training runs' `DDP(bits=16)`; `DDP.bits` itself is
  not read here, so one sweep compares the methods at one gradient width) for DDP and DiLoCo;
  the config's `bits` for Streaming and Decoupled (quantization scales, < 1% of the payload,
  are left out). Route factor: a ring all-reduce over R replicas moves 2(R-1)/R of the payload
  per replica (DDP, DiLoCo, Streaming; R=1 sends nothing). Decoupled: 1 — each learner
  uploads its fragment to the syncer over its own link and the syncer's reply (at
  `down_bits`) comes back the other direction of the full-duplex link, so the busier direction
  counts: max(bits, down_bits) (choice); `replicas` does not enter. Link and ring factor are
  `clock`'s, the training runs'.
- **Schedule and deadline** (a missed deadline stalls the clock until the sync has arrived):
  the one `clock.Schedule` of the training runs: DDP all-reduces every step, deadline the end
  of that step; DiLoCo sends everything every H steps (on the H-th), deadline the end of that
  step; Streaming and Decoupled send fragment p after steps floor((p+1)*H/P) mod H (fragments
  due on the same step go together), deadline the end of step t+tau.
- **Steady state.** The schedule repeats every `period` steps (1 for DDP, H otherwise). We
  simulate `WARMUP_PERIODS + MEASURE_PERIODS` periods from an empty link and measure the last
  ones. If in steady state the link is ever idle, the state regenerates from empty and the
  window is exact; if it is never idle, each period lasts exactly (bits per period)/B, so the
  measured period time is raised to at least that (throughput bound). Tests check the window
  against long runs.
- **Closed forms** the tests hold the simulator to (S: bits on the link per full sync,
  h = (2T/3)(1 - 1/buckets) the part of a burst hidden behind the backward pass, A = allowed
  stall per period): a DDP step stalls max(S/B - h, S/(buckets*B)) + latency; while each burst
  is the bottleneck (for DDP and DiLoCo: S/B >= 2T/3), S/B_ddp = h + T(1-u)/u,
  S/B_diloco = h + A and S/B_streaming = P(tau*T + h) + A with A = H*T(1-u)/u: DiLoCo needs
  about H times less than DDP (exactly H when h = 0, i.e. one bucket), and P fragments about
  P times less than DiLoCo as A -> 0.
- **Search.** `required_bandwidth` brackets the answer between the throughput bound and a
  growing upper end, then bisects in log space; the returned B has utilization >= target and
  B*(1 - RESOLUTION) has utilization < target (RESOLUTION = 0.1%).
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..clock import GBIT, ring_factor, transfer_seconds
from ..clock.schedule import Schedule
from ..config import DDP, DecoupledDiLoCo, DiLoCo, StreamingDiLoCo, check, check_int, check_positive

BUCKETS = 32  # gradient buckets per backward pass (about one per layer of a 30-layer model)
WARMUP_PERIODS = 3
MEASURE_PERIODS = 2
RESOLUTION = 1e-3  # relative resolution of required_bandwidth

SWEEP_METHODS = (
    DDP(),
    DiLoCo(inner_steps=100),
    StreamingDiLoCo(inner_steps=100, fragments=10, overlap=1, bits=4),
    DecoupledDiLoCo(down_bits=4),
)
SWEEP_MODELS = ((1e9, 0.5), (1e10, 1.6), (1e11, 5.0))  # (parameters, step time in s), assumed
SWEEP_TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)


def compute_utilization(
    algorithm,
    *,
    n_params: float,
    step_time_s: float,
    bandwidth_gbps: float,
    replicas: int = 2,
    grad_bits: int = 16,
    latency_s: float = 0.0,
    steps: int | None = None,
    buckets: int = BUCKETS,
) -> float:
    """Steady-state compute / (compute + stall) in [0, 1] at `bandwidth_gbps` (math.inf allowed).

    `steps`: simulate this many steps (rounded up to whole schedule periods, at least 2) and
    measure the second half; None: the default window (see the module docstring).
    """
    _check_common(n_params, step_time_s, replicas, grad_bits, latency_s, buckets)
    _check_bandwidth("bandwidth_gbps", bandwidth_gbps)
    if steps is not None:
        check_int("steps", steps, 1)
    sched = _schedule(algorithm, replicas, grad_bits)
    periods = _periods(sched[0], steps)
    u = _utilization(
        sched, n_params, step_time_s, bandwidth_gbps * GBIT, latency_s, buckets, periods
    )
    return float(u)


def utilization_curve(
    algorithm,
    *,
    n_params: float,
    step_time_s: float,
    bandwidths_gbps,
    replicas: int = 2,
    grad_bits: int = 16,
    latency_s: float = 0.0,
    buckets: int = BUCKETS,
) -> np.ndarray:
    """`compute_utilization` at every bandwidth of `bandwidths_gbps`, in one vectorized pass."""
    _check_common(n_params, step_time_s, replicas, grad_bits, latency_s, buckets)
    b = np.asarray(bandwidths_gbps, dtype=float)
    check(b.size > 0 and bool(np.all(b > 0)), "bandwidths_gbps", b, "numbers > 0")
    sched = _schedule(algorithm, replicas, grad_bits)
    return _utilization(
        sched, n_params, step_time_s, b * GBIT, latency_s, buckets, _periods(sched[0])
    )


def required_bandwidth(
    algorithm,
    *,
    n_params: float,
    step_time_s: float,
    target_utilization: float,
    replicas: int = 2,
    grad_bits: int = 16,
    latency_s: float = 0.0,
    buckets: int = BUCKETS,
) -> float:
    """Smallest bandwidth (Gbit/s, within RESOLUTION) whose utilization reaches the target.

    Returns 0.0 when nothing is sent (a ring of one replica) and math.inf when even an infinite
    bandwidth falls short (latency or the last bucket's tail costs more than the target allows).
    """
    _check_common(n_params, step_time_s, replicas, grad_bits, latency_s, buckets)
    _check_target(target_utilization)
    out = required_bandwidths(
        algorithm,
        n_params=n_params,
        step_time_s=step_time_s,
        targets=target_utilization,
        replicas=replicas,
        grad_bits=grad_bits,
        latency_s=latency_s,
        buckets=buckets,
    )
    return float(out)


def required_bandwidths(
    algorithm,
    *,
    n_params,
    step_time_s,
    targets,
    replicas: int = 2,
    grad_bits: int = 16,
    latency_s=0.0,
    buckets: int = BUCKETS,
) -> np.ndarray:
    """`required_bandwidth` for arrays of cases (n_params, step_time_s, targets, latency_s are
    broadcast together); one vectorized monotone search for all of them. Inputs are trusted
    (validated by the scalar functions and `sweep`)."""
    sched = _schedule(algorithm, replicas, grad_bits)
    n, t, u, lat = np.broadcast_arrays(
        *(np.asarray(x, float) for x in (n_params, step_time_s, targets, latency_s))
    )
    periods = _periods(sched[0])

    def util(bps):
        return _utilization(sched, n, t, bps, lat, buckets, periods)

    payload = n * sched[3]  # bits per period on the link
    avg_bps = payload / (sched[0] * t)
    result = np.full(n.shape, np.inf)
    result[payload == 0] = 0.0
    todo = (payload > 0) & (util(np.full(n.shape, np.inf)) >= u)
    # Throughput bound: utilization <= B / avg_bps, so lo is always short of the target.
    lo = np.where(todo, u * avg_bps * (1 - RESOLUTION), 1.0)
    hi = lo.copy()
    short = todo.copy()
    for _ in range(200):  # grow hi by 4x until every case reaches its target
        if not short.any():
            break
        hi = np.where(short, hi * 4, hi)
        lo = np.where(short, hi / 4, lo)
        short = todo & (util(hi) < u)
    todo &= ~short  # still short after 4**200: treated as unreachable (inf)
    while np.any(todo & (hi > lo * (1 + RESOLUTION))):
        mid = np.sqrt(lo * hi)
        ok = util(mid) >= u
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
    result[todo] = hi[todo] / GBIT
    return result


def sweep(
    methods=SWEEP_METHODS,
    models=SWEEP_MODELS,
    targets=SWEEP_TARGETS,
    *,
    replicas: int = 8,
    grad_bits: int = 16,
    latency_s: float = 0.0,
) -> list[dict]:
    """Required bandwidth for every (method, model, target): one row dict per case, with keys
    method, n_params, step_time_s, target_utilization, required_gbps. One search per method."""
    for n, t in models:
        check_positive("n_params", n)
        check_positive("step_time_s", t)
    for u in targets:
        _check_target(u)
    _check_common(1.0, 1.0, replicas, grad_bits, latency_s, BUCKETS)
    n = np.array([m[0] for m in models])[:, None]
    t = np.array([m[1] for m in models])[:, None]
    u = np.array(targets, dtype=float)[None, :]
    rows = []
    for alg in methods:
        req = required_bandwidths(
            alg,
            n_params=n,
            step_time_s=t,
            targets=u,
            replicas=replicas,
            grad_bits=grad_bits,
            latency_s=latency_s,
        )
        keys = ("method", "n_params", "step_time_s", "target_utilization", "required_gbps")
        for (i, j), gbps in np.ndenumerate(req):
            values = (alg.name, float(n[i, 0]), float(t[i, 0]), float(u[0, j]), float(gbps))
            rows.append(dict(zip(keys, values, strict=True)))
    return rows


def bench_sweep() -> dict:
    """Time the full sweep: 4 methods x 3 model sizes x 5 targets (`SWEEP_*`)."""
    start = time.perf_counter()
    rows = sweep()
    elapsed = time.perf_counter() - start
    return {
        "sweep_s": round(elapsed, 4),
        "cases": len(rows),
        "ms_per_case": round(1e3 * elapsed / len(rows), 3),
    }


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _schedule(algorithm, replicas: int, grad_bits: int):
    """(period, offsets, fractions, link bits per parameter per period, overlap), from the one
    `clock.Schedule` of the training runs."""
    sched = Schedule.of(algorithm)  # validates the algorithm
    offsets, fractions = sched.phases()
    ring = ring_factor(replicas)
    if isinstance(algorithm, (DDP, DiLoCo)):
        return sched.inner_steps, offsets, fractions, grad_bits * ring, 0
    if isinstance(algorithm, DecoupledDiLoCo):  # up and down share a full-duplex link
        bits = max(algorithm.bits, algorithm.down_bits)
        return sched.inner_steps, offsets, fractions, bits, sched.overlap
    return sched.inner_steps, offsets, fractions, algorithm.bits * ring, sched.overlap


def _periods(period: int, steps: int | None = None) -> tuple[int, int]:
    """(periods simulated, periods measured at the end)."""
    if steps is None:
        return WARMUP_PERIODS + MEASURE_PERIODS, MEASURE_PERIODS
    total = max(2, -(-steps // period))
    return total, total // 2


def _utilization(sched, n_params, step_time, bps, latency, buckets: int, periods) -> np.ndarray:
    """The event loop, vectorized over broadcast cases; see the module docstring."""
    period, offsets, fractions, bits_per_param, overlap = sched
    total, measured = periods
    n, t, b, lat = np.broadcast_arrays(
        *(np.asarray(x, float) for x in (n_params, step_time, bps, latency))
    )
    payload = n * bits_per_param
    sends = payload > 0
    transfer = np.where(sends, transfer_seconds(payload, b), 0.0)  # a whole period's payload
    lat = np.where(sends, lat, 0.0)
    # Events (step, kind, sync id, fraction): kind 0 = release during the step, 1 = deadline at
    # its end; a sync released at step k is due at the end of step k + overlap.
    events = []
    for i in range(total):
        for j, (o, f) in enumerate(zip(offsets, fractions, strict=True)):
            k = i * period + int(o)
            events.append((k, 0, (i, j), f))
            if k + overlap < total * period:
                events.append((k + overlap, 1, (i, j), f))
    events.sort(key=lambda e: (e[0], e[1]))
    start = (total - measured) * period
    stall = np.zeros(n.shape)  # accumulated stall: step k starts at k*T + stall
    link_free = np.full(n.shape, -np.inf)
    arrival, stall_at_start = {}, None
    for k, kind, sync, f in events:
        if stall_at_start is None and k >= start:
            stall_at_start = stall.copy()
        s = k * t + stall
        if kind == 0:
            dt = f * transfer
            first_ready = s + t / 3 + (2 * t / 3) / buckets
            # FIFO with equal buckets released at an even pace: the last bucket leaves at the
            # later of "first ready, then all back to back" and "last ready, then one bucket".
            link_free = np.maximum(np.maximum(link_free, first_ready) + dt, s + t + dt / buckets)
            arrival[sync] = link_free + lat
        else:
            stall = stall + np.maximum(0.0, arrival.pop(sync) - (s + t))
    compute = measured * period * t
    elapsed = np.maximum(compute + stall - stall_at_start, measured * transfer)
    return compute / elapsed


def _check_common(n_params, step_time_s, replicas, grad_bits, latency_s, buckets) -> None:
    check_positive("n_params", n_params)
    check_positive("step_time_s", step_time_s)
    check_int("replicas", replicas, 1)
    check_int("grad_bits", grad_bits, 1, 64)
    _check_real("latency_s", latency_s, lambda x: 0 <= x < math.inf, "a finite number >= 0")
    check_int("buckets", buckets, 1)


def _check_bandwidth(field: str, value) -> None:
    _check_real(field, value, lambda x: x > 0, "a number > 0 (math.inf allowed)")


def _check_target(value) -> None:
    _check_real("target_utilization", value, lambda x: 0 < x < 1, "a number in (0, 1)")


def _check_real(field: str, value, predicate, allowed: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and predicate(value)
    check(ok, field, value, allowed)
