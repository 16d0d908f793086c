"""Goodput under chip failures: a discrete-event chaos simulator (docs/algorithms.md §5).

Chips fail as independent Poisson processes, so a group of n chips fails at rate
n / MTBI. The simulator draws failures per *failure domain*, never per chip: 1.2M chips
at one failure per chip-year is one failure every ~26 s, and a week of that is ~23k events,
processed as numpy arrays. Three schemes, one event loop (`_run_domain`):

| scheme       | domains    | on a failure                                                 |
|--------------|------------|--------------------------------------------------------------|
| "dp"         | the job    | stop, detect, reschedule, reload; redo work since checkpoint |
| "elastic_dp" | the job    | short stall; the failed replica's chips are missing a while  |
| "decoupled"  | M learners | only that learner stops, loses unsynced work, rejoins        |

Chip-time is booked to exactly one bucket (`BUCKETS`); buckets are reported in seconds of
whole-cluster time, so they sum to the wall time. Goodput = useful / wall.

Decoupled quorum (**choice**): while fewer than K learners are up the syncer cannot take an
outer step; the up learners keep stepping but their committed time is booked to "waiting",
not "useful" (conservative). With the paper's K = 1 nothing is ever booked there.
Closed forms live in `goodput_closed`; `expected_goodput` applies them to a scheme.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..config import check, check_int, check_positive
from . import goodput_closed as cf

SECONDS_PER_YEAR = 365.25 * 86400.0
SCHEMES = ("dp", "elastic_dp", "decoupled")
BUCKETS = ("useful", "checkpoint", "lost", "restart", "rejoin", "waiting", "down")


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    """Cluster size, failure rate and every timing (seconds) of the chaos simulation.

    Only `chips`, `mtbi_chip_years` and `sync_steps` come from the paper (second-hand,
    docs/algorithms.md §7). No timing was published; the others are one calibrated set, chosen
    so that at 1.2M chips dp ≈ 27% (blog), elastic_dp ≈ 58% and decoupled M=8 ≈ 88% (paper).
    They sit where docs/algorithms.md §7 says they must: failures every ~26 s, a full restart
    of that order, and a learner recovery clearly cheaper than a full restart.

    - `chips`: chips in the job (paper: 1.2M; sweep 150k → 2.4M).
    - `mtbi_chip_years`: mean time between interruptions of one chip (paper: 1 year).
    - `detect_s` (5): time to notice a failure (heartbeat timeout). Calibrated.
    - `reschedule_s` (30): dp only: swap in spare hosts and restart the processes of the
      whole job. Failures meanwhile are absorbed into the same reschedule. Calibrated.
    - `reload_s` (5): dp only: load the last checkpoint on every chip; a failure here forces
      a new restart. Calibrated (in-memory checkpoints, hence seconds).
    - `checkpoint_s` (1): blocking part of one checkpoint write. Calibrated.
    - `checkpoint_interval_s` (None): dp work between checkpoints; None = Daly's optimum
      (6.6 s at the defaults).
    - `step_s` (1): one training step; elastic_dp loses the step in flight, a learner syncs
      every `sync_steps` steps. Illustrative.
    - `reconfigure_s` (13): elastic_dp stall after detection: drop the failed replica and
      re-form the collectives; failures meanwhile are folded into the same stall.
      Calibrated to elastic DP ≈ 58% at 1.2M chips.
    - `replica_chips` (256): chips one failure takes out of the elastic job (one model
      replica). Illustrative.
    - `replacement_s` (600): time until those chips are replaced and join again. Illustrative.
    - `learner_reschedule_s` (5): decoupled: swap spares into one learner and restart only its
      processes (1/M of the job, no global barrier). Calibrated.
    - `rejoin_s` (5): decoupled: load the current global fragments from the syncer and a
      healthy peer's optimizer state (§4); a failure here restarts it. Calibrated.
    - `sync_steps` (24): H, steps between a fragment's syncs (paper default, second-hand); a
      failed learner loses the work since its last sync.
    - `sync_s` (0): blocking part of a learner's sync; 0 because syncs overlap compute (τ).
    """

    chips: int = 1_200_000
    mtbi_chip_years: float = 1.0
    detect_s: float = 5.0
    reschedule_s: float = 30.0
    reload_s: float = 5.0
    checkpoint_s: float = 1.0
    checkpoint_interval_s: float | None = None
    step_s: float = 1.0
    reconfigure_s: float = 13.0
    replica_chips: int = 256
    replacement_s: float = 600.0
    learner_reschedule_s: float = 5.0
    rejoin_s: float = 5.0
    sync_steps: int = 24
    sync_s: float = 0.0

    def __post_init__(self):
        check_int("ChaosConfig.chips", self.chips, 1)
        for name in ("mtbi_chip_years", "detect_s", "reschedule_s", "reload_s", "checkpoint_s",
                     "step_s", "reconfigure_s", "replacement_s", "learner_reschedule_s",
                     "rejoin_s"):
            check_positive(f"ChaosConfig.{name}", getattr(self, name))
        if self.checkpoint_interval_s is not None:
            check_positive("ChaosConfig.checkpoint_interval_s", self.checkpoint_interval_s)
        check_int("ChaosConfig.replica_chips", self.replica_chips, 1, self.chips)
        check_int("ChaosConfig.sync_steps", self.sync_steps, 1)
        s = self.sync_s
        ok = isinstance(s, (int, float)) and not isinstance(s, bool) and 0 <= s < math.inf
        check(ok, "ChaosConfig.sync_s", s, "a finite number >= 0")

    @property
    def failure_rate(self) -> float:
        """Failures per second of the whole cluster: chips / MTBI."""
        return self.chips / (self.mtbi_chip_years * SECONDS_PER_YEAR)

    @property
    def mtbf_s(self) -> float:
        """Mean time between failures of the whole cluster, in seconds (~26 s at 1.2M chips)."""
        return 1.0 / self.failure_rate

    @property
    def dp_checkpoint_interval(self) -> float:
        """The dp checkpoint interval: the given one, else Daly's optimum."""
        if self.checkpoint_interval_s is not None:
            return self.checkpoint_interval_s
        return cf.daly_interval(self.checkpoint_s, self.mtbf_s)


@dataclasses.dataclass(frozen=True)
class Domain:
    """One failure domain's parameters (the job, or one learner); see `goodput_closed`."""

    count: int  # identical independent domains (1, or M learners)
    share: float  # fraction of all chips in one domain
    rate: float  # failures per second of one domain
    interval_s: float  # work between commits (checkpoint, step, sync)
    commit_s: float  # blocking cost of one commit
    absorbed_s: float  # recovery that folds in further failures (detect + reschedule)
    exposed_s: float  # recovery that a failure restarts (reload, rejoin)
    bucket: str  # where recovery time is booked
    down_fraction: float = 0.0  # cluster share one failure takes out until replaced
    replacement_s: float = 0.0


def domain(scheme: str, chaos: ChaosConfig, learners: int = 1) -> Domain:
    """Map a scheme onto the one event loop: how many domains, and what a failure costs."""
    check(scheme in SCHEMES, "scheme", scheme, f"one of {SCHEMES}")
    c, lam = chaos, chaos.failure_rate
    if scheme == "dp":
        return Domain(1, 1.0, lam, c.dp_checkpoint_interval, c.checkpoint_s,
                      c.detect_s + c.reschedule_s, c.reload_s, "restart")
    if scheme == "elastic_dp":
        return Domain(1, 1.0, lam, c.step_s, 0.0, c.detect_s + c.reconfigure_s, 0.0, "restart",
                      c.replica_chips / c.chips, c.replacement_s)
    return Domain(learners, 1.0 / learners, lam / learners, c.sync_steps * c.step_s, c.sync_s,
                  c.detect_s + c.learner_reschedule_s, c.rejoin_s, "rejoin")


@dataclasses.dataclass(frozen=True)
class GoodputResult:
    """One simulation. `buckets`: seconds of whole-cluster time per bucket, summing to
    `wall_s`; `uptime`: fraction of time at least `quorum` domains were running;
    `failures`: failures that started a recovery."""

    scheme: str
    chips: int
    learners: int
    quorum: int
    seed: int
    wall_s: float
    buckets: dict
    failures: int
    uptime: float

    @property
    def goodput(self) -> float:
        """Fraction of chip-time that became committed training progress."""
        return self.buckets["useful"] / self.wall_s


@dataclasses.dataclass(frozen=True)
class GoodputInterval:
    """Goodput over several seeds: mean and 95% Student-t interval of the mean."""

    mean: float
    low: float
    high: float
    results: tuple

    def buckets(self) -> dict:
        """Mean seconds per bucket over the seeds."""
        return {b: float(np.mean([r.buckets[b] for r in self.results])) for b in BUCKETS}


def simulate(scheme: str, chaos: ChaosConfig, *, learners: int = 8, quorum: int = 1,
             days: float = 7.0, seed: int = 0) -> GoodputResult:
    """Simulate `days` of training under failures; same seed, same numbers.

    `learners` and `quorum` only matter for "decoupled" (M and K); the others use one domain."""
    _check_run(scheme, chaos, learners, quorum, days, seed)
    learners, quorum = (learners, quorum) if scheme == "decoupled" else (1, 1)
    dom = domain(scheme, chaos, learners)
    horizon = days * 86400.0
    paths = [_run_domain(dom, horizon, rng) for rng in np.random.default_rng(seed).spawn(dom.count)]
    buckets = dict.fromkeys(BUCKETS, 0.0)
    for path in paths:
        for name, seconds in path["buckets"].items():
            buckets[name] += dom.share * seconds
    ups = [(p["run_start"], p["run_end"]) for p in paths]
    if quorum > 1:
        # Committed time while fewer than `quorum` learners run goes to "waiting" (module doc).
        knots, below = _count_integral(ups, lambda n: n < quorum, horizon)
        work = dom.interval_s / (dom.interval_s + dom.commit_s)
        for p in paths:
            waited = work * float(np.sum(np.interp(p["commit_end"], knots, below)
                                         - np.interp(p["run_start"], knots, below)))
            buckets["useful"] -= dom.share * waited
            buckets["waiting"] += dom.share * waited
    knots, up = _count_integral(ups, lambda n: n >= quorum, horizon)
    return GoodputResult(scheme, chaos.chips, learners, quorum, seed, horizon, buckets,
                         sum(p["failures"] for p in paths), float(up[-1]) / horizon)


def simulate_interval(scheme: str, chaos: ChaosConfig, *, learners: int = 8, quorum: int = 1,
                      days: float = 7.0, seeds: int | Sequence[int] = 8) -> GoodputInterval:
    """`simulate` over several seeds (an int n means seeds 0..n−1), with a 95% interval."""
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    check(len(seeds) >= 2, "seeds", seeds, "at least 2 seeds")
    runs = tuple(simulate(scheme, chaos, learners=learners, quorum=quorum, days=days, seed=s)
                 for s in seeds)
    g = np.array([r.goodput for r in runs])
    half = cf.t_quantile_975(len(g) - 1) * g.std(ddof=1) / math.sqrt(len(g))
    return GoodputInterval(float(g.mean()), float(g.mean() - half), float(g.mean() + half), runs)


def expected_goodput(scheme: str, chaos: ChaosConfig, *, learners: int = 8,
                     quorum: int = 1) -> float:
    """Closed-form long-run goodput of a scheme (`goodput_closed`), to check `simulate`."""
    _check_run(scheme, chaos, learners, quorum, 1.0, 0)
    learners, quorum = (learners, quorum) if scheme == "decoupled" else (1, 1)
    d = domain(scheme, chaos, learners)
    g = cf.domain_goodput(d.rate, d.interval_s, d.commit_s, d.absorbed_s, d.exposed_s)
    if scheme == "elastic_dp":
        # Mean share of chips waiting for replacement (Little's law: rate × time × size).
        return g * (1.0 - min(1.0, d.rate * d.replacement_s * d.down_fraction))
    up = cf.up_fraction(d.rate, d.absorbed_s, d.exposed_s)
    return cf.islands_goodput(g, up, d.count, quorum)


def timeline(scheme: str, chaos: ChaosConfig, *, learners: int = 8, hours: float = 1.0,
             seed: int = 0) -> list[dict]:
    """Tidy intervals of one simulated stretch: domain, state ("up", "down" while detecting and
    rescheduling, "recovering" while reloading or rejoining), start_s, end_s."""
    _check_run(scheme, chaos, learners, 1, hours / 24.0, seed)
    dom = domain(scheme, chaos, learners)
    horizon = hours * 3600.0
    rows = []
    for i, rng in enumerate(np.random.default_rng(seed).spawn(dom.count)):
        p = _run_domain(dom, horizon, rng)
        for state, lo, hi in (("down", p["start"], p["exposed_start"]),
                              ("recovering", p["exposed_start"], p["run_start"]),
                              ("up", p["run_start"], p["run_end"])):
            rows += [{"domain": i, "state": state, "start_s": float(a), "end_s": float(b)}
                     for a, b in zip(lo, hi, strict=True) if b > a]
    return sorted(rows, key=lambda r: (r["domain"], r["start_s"]))


# --------------------------------------------------------------------------------------------
# The event loop, vectorized over the gaps between failures
# --------------------------------------------------------------------------------------------


def _run_domain(d: Domain, horizon: float, rng: np.random.Generator) -> dict:
    """Simulate one domain up to `horizon`; return its bucket seconds and its intervals.

    Failures are memoryless, so after a failure the next one that matters comes after the
    absorbed recovery plus an Exp(rate) wait: the gaps are drawn directly and each gap is
    booked in closed form (recovery, whole commit cycles, then lost work; the last stretch ends
    with the run, not with a failure, so its work is kept)."""
    gaps = np.empty(0)
    while gaps.sum() < horizon:  # draw in chunks until the horizon is covered
        n = int(d.rate * horizon + 6 * math.sqrt(d.rate * horizon) + 16)
        more = rng.exponential(1.0 / d.rate, n)
        more += d.absorbed_s
        if gaps.size == 0:
            more[0] -= d.absorbed_s  # the job starts healthy, with no recovery to do
        gaps = np.concatenate([gaps, more])
    start = np.concatenate([[0.0], np.cumsum(gaps)])
    n = int(np.searchsorted(start, horizon, side="left"))  # gaps that begin before the horizon
    start, end = start[:n], np.minimum(start[1 : n + 1], horizon)
    absorbed = np.full(n, d.absorbed_s)
    exposed = np.full(n, d.exposed_s)
    absorbed[0] = exposed[0] = 0.0
    exposed_start = np.minimum(start + absorbed, end)
    run_start = np.minimum(exposed_start + exposed, end)
    cycle = d.interval_s + d.commit_s
    cycles = np.floor((end - run_start) / cycle)
    commit_end = run_start + cycles * cycle
    # The end of the simulated stretch is not a failure: the work since the last commit is kept
    # (committed by the run's final checkpoint, whose cost is not charged).
    tail = end[-1] - commit_end[-1]
    commit_end[-1] = end[-1]
    buckets = dict.fromkeys(BUCKETS, 0.0)
    buckets[d.bucket] = float(np.sum(run_start - start))
    buckets["useful"] = float(np.sum(cycles)) * d.interval_s + float(tail)
    buckets["checkpoint"] = float(np.sum(cycles)) * d.commit_s
    buckets["lost"] = float(np.sum(end - commit_end))
    if d.down_fraction > 0:
        _book_missing_chips(d, buckets, rng, horizon, start, run_start, commit_end, end)
    return {"buckets": buckets, "failures": n - 1, "start": start, "exposed_start": exposed_start,
            "run_start": run_start, "commit_end": commit_end, "run_end": end}


def _book_missing_chips(d: Domain, buckets: dict, rng: np.random.Generator, horizon: float,
                        start, run_start, commit_end, end) -> None:
    """Elastic job: each failure (also those folded into a stall) takes `down_fraction` of the
    chips out for `replacement_s`; move their share of every interval to "down"."""
    folded = rng.poisson(d.rate * d.absorbed_s, start.size - 1)
    times = np.concatenate([start[1:], np.repeat(start[1:], folded)
                            + rng.uniform(0.0, d.absorbed_s, folded.sum())])
    times = times[times < horizon]
    outages = [(times, np.minimum(times + d.replacement_s, horizon))]
    knots, missing = _count_integral(outages, lambda k: np.minimum(k * d.down_fraction, 1.0),
                                     horizon)
    gone = lambda lo, hi: np.interp(hi, knots, missing) - np.interp(lo, knots, missing)
    work = d.interval_s / (d.interval_s + d.commit_s)
    committed = float(np.sum(gone(run_start, commit_end)))
    buckets[d.bucket] -= float(np.sum(gone(start, run_start)))
    buckets["useful"] -= work * committed
    buckets["checkpoint"] -= (1.0 - work) * committed
    buckets["lost"] -= float(np.sum(gone(commit_end, end)))
    buckets["down"] += float(missing[-1])


def _count_integral(intervals, weight, horizon: float):
    """Knots and running integral of weight(n(t)), n(t) = how many of the (starts, ends)
    intervals cover t; evaluate anywhere in [0, horizon] with np.interp (it is piecewise
    linear between the knots)."""
    times = np.concatenate([np.concatenate([lo, hi]) for lo, hi in intervals])
    steps = np.concatenate([np.concatenate([np.ones(lo.size), -np.ones(hi.size)])
                            for lo, hi in intervals])
    order = np.argsort(times, kind="stable")
    knots = np.concatenate([[0.0], times[order], [horizon]])
    count = np.concatenate([[0.0], np.cumsum(steps[order])])
    rate = np.asarray(weight(np.rint(count)), dtype=float)
    return knots, np.concatenate([[0.0], np.cumsum(rate * np.diff(knots))])


def _check_run(scheme: str, chaos: ChaosConfig, learners: int, quorum: int, days: float,
               seed: int) -> None:
    check(scheme in SCHEMES, "scheme", scheme, f"one of {SCHEMES}")
    check(isinstance(chaos, ChaosConfig), "chaos", chaos, "a ChaosConfig")
    check_int("learners", learners, 1)
    check_int("quorum", quorum, 1, learners)
    check_positive("days", days)
    check_int("seed", seed, 0)
