"""The simulated clock: how long each learner's steps take, when it fails, and what a link costs.

Every training run lives on one simulated clock (`sim_time_s` in its history), whatever the
method. `RunConfig.cluster` describes the machines; `None` means the default `Cluster()`: every
learner takes one second per step and the link is free, so `sim_time_s` counts steps.

    Cluster(step_time_s=(1, 1, 1, 2, 1, 1, 1, 1))          # learner 3 is twice as slow
    Cluster(jitter=0.1, link=Link(gbit_per_s=1.0, latency_s=0.05))
    Cluster(failures=((2, 30.0, 90.0),))                   # learner 2 is down from 30 s to 90 s
    Cluster(failures=FailureRate(mtbf_s=200, down_s=40))    # drawn (seeded) per learner

The link is the bandwidth simulator's model (`systems.bandwidth`): a message of `bits` holds the
link for bits / (gbit_per_s · 1e9) seconds, first in first out, and arrives `latency_s` after it
leaves. A lock-step exchange costs what the library's collective moves, on a ring (the α-β
model): DDP's gradient all-reduce `ring_factor(M)` = 2(M−1)/M of its payload per worker and
2(M−1) hops (`DDP(bits=16)`: its all-to-all and all-gather of the bfloat16 payload move the
same 2(M−1)/M, and are charged the same hops); DiLoCo's and Streaming's all-gather of the
b-bit payloads (they cannot be summed without decoding) `gather_factor(M)` = M−1 payloads per
worker and M−1 hops; each hop adds `latency_s` (`exchange_cost`). tests/test_testbed.py
measures both factors on real links.

Decoupled DiLoCo's messages cross hosts (`Links`): host 0 is the syncer's, host m + 1 learner
m's, each with its full-duplex link. A message of n bytes from host a to host b holds a's
sending side and b's receiving side for n · 8 / bandwidth seconds, both first in first out
(it starts once both are free: with equal rates a single stream is not slowed by the second
hop), and arrives `latency_s` after it leaves. So the M answers of a sync queue on the
syncer's receiving side, and the syncer's M copies of a merged fragment (the b-bit reply,
`DecoupledDiLoCo.down_bits`: one per learner up, in learner order) on its sending side.
tests/test_testbed.py and `actors.measure` measure both on real links.

The rest of the package turns a config into a *plan* on this clock (`schedule`: the one
schedule of sends and arrivals; `lockstep`: DDP, DiLoCo, Streaming; `syncer`: Decoupled, whose
decisions are the state machine of `syncer_state` and the learners' side `learner_rules`,
which a real runtime drives too, booked in `booking`'s order on both).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..validate import check, check_int

GBIT = 1e9


def _real(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def _check_time(field: str, value: Any, allow_zero: bool = False) -> None:
    ok = _real(value) and value == value and math.isfinite(value) and (
        value >= 0 if allow_zero else value > 0)
    check(ok, field, value, "a finite number >= 0" if allow_zero else "a finite number > 0")


@dataclasses.dataclass(frozen=True)
class Link:
    """One full-duplex link per learner: `gbit_per_s` (math.inf: free) and one-way `latency_s`."""

    gbit_per_s: float = math.inf
    latency_s: float = 0.0

    def __post_init__(self):
        ok = _real(self.gbit_per_s) and self.gbit_per_s > 0 and self.gbit_per_s == self.gbit_per_s
        check(ok, "Link.gbit_per_s", self.gbit_per_s, "a number > 0 (math.inf: a free link)")
        _check_time("Link.latency_s", self.latency_s, allow_zero=True)

    def busy_s(self, nbytes: float) -> float:
        """Seconds `nbytes` hold the link (0 on a free link)."""
        return transfer_seconds(8.0 * nbytes, self.gbit_per_s * GBIT)


def transfer_seconds(bits, bits_per_s):
    """bits / bandwidth, elementwise (numpy arrays welcome); 0 where the bandwidth is infinite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.isinf(bits_per_s), 0.0, np.asarray(bits, float) / bits_per_s)
    return float(out) if np.ndim(out) == 0 else out


def ring_factor(replicas: int) -> float:
    """A ring all-reduce over R replicas moves 2(R−1)/R of the payload per replica."""
    return 2.0 * (replicas - 1) / replicas


def gather_factor(replicas: int) -> float:
    """A ring all-gather over R replicas moves R−1 payloads per replica (each forwards every
    other replica's payload once)."""
    return float(replicas - 1)


def exchange_cost(replicas: int, gather: bool) -> tuple[float, int]:
    """(payloads each replica sends, sequential hops) of one lock-step exchange on a ring: the
    all-gather (`gather`) or the all-reduce; each hop waits one link latency."""
    if gather:
        return gather_factor(replicas), replicas - 1
    return ring_factor(replicas), 2 * (replicas - 1)


@dataclasses.dataclass(frozen=True)
class FailureRate:
    """Failures drawn per learner (seeded): a Poisson process with mean time between failures
    `mtbf_s` for *one* learner; each failure takes it down for `down_s` (detection, restart and
    reload), in the style of `systems.goodput.ChaosConfig` (see `ChaosConfig.learner_failures`)."""

    mtbf_s: float
    down_s: float

    def __post_init__(self):
        _check_time("FailureRate.mtbf_s", self.mtbf_s)
        _check_time("FailureRate.down_s", self.down_s)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The machines of one run (module docstring). Times in seconds.

    - `step_time_s`: one time for every learner, or one per learner (a tuple of M);
    - `speed_spread`: multiply learner m's time by exp(spread · z_m), z_m ~ N(0, 1) (seeded);
    - `jitter`: every step's time is multiplied by 1 + jitter · u, u ~ U(−1, 1) (seeded);
    - `link`: each learner's network link;
    - `failures`: `(learner, down_at_s, up_at_s)` triples (up_at_s may be math.inf: it never
      comes back), or a `FailureRate` to draw them;
    - `seed`: for the spread, the jitter and drawn failures. Same seed, same clock.
    """

    step_time_s: float | tuple[float, ...] = 1.0
    speed_spread: float = 0.0
    jitter: float = 0.0
    link: Link = dataclasses.field(default_factory=Link)
    failures: tuple[tuple[int, float, float], ...] | FailureRate = ()
    seed: int = 0

    def __post_init__(self):
        times = self.step_time_s
        if isinstance(times, (tuple, list)):
            check(len(times) > 0, "Cluster.step_time_s", times, "a number or a non-empty tuple")
            for i, t in enumerate(times):
                _check_time(f"Cluster.step_time_s[{i}]", t)
            object.__setattr__(self, "step_time_s", tuple(float(t) for t in times))
        else:
            _check_time("Cluster.step_time_s", times)
        _check_time("Cluster.speed_spread", self.speed_spread, allow_zero=True)
        ok = _real(self.jitter) and 0 <= self.jitter < 1
        check(ok, "Cluster.jitter", self.jitter, "a number in [0, 1)")
        check(isinstance(self.link, Link), "Cluster.link", self.link, "a Link")
        check_int("Cluster.seed", self.seed, 0)
        if not isinstance(self.failures, FailureRate):
            check(isinstance(self.failures, (tuple, list)), "Cluster.failures", self.failures,
                  "a tuple of (learner, down_at_s, up_at_s) or a FailureRate")
            object.__setattr__(self, "failures", tuple(tuple(f) for f in self.failures))
            _check_windows(self.failures)

    def check_learners(self, learners: int) -> None:
        """Cross-checks that need M (`RunConfig` calls this)."""
        if isinstance(self.step_time_s, tuple):
            check(len(self.step_time_s) == learners, "Cluster.step_time_s", self.step_time_s,
                  f"one number, or {learners} numbers (one per learner)")
        if not isinstance(self.failures, FailureRate):
            for i, (m, *_rest) in enumerate(self.failures):
                check_int(f"Cluster.failures[{i}] learner", m, 0, learners - 1)


def _check_windows(failures: tuple) -> None:
    last_up: dict[int, float] = {}
    for i, f in enumerate(failures):
        check(len(f) == 3, f"Cluster.failures[{i}]", f, "a (learner, down_at_s, up_at_s) triple")
        m, down, up = f
        check_int(f"Cluster.failures[{i}] learner", m, 0)
        _check_time(f"Cluster.failures[{i}] down_at_s", down, allow_zero=True)
        ok = _real(up) and up == up and up > down
        check(ok, f"Cluster.failures[{i}] up_at_s", up, f"a number > down_at_s={down} "
              "(math.inf: never comes back)")
        check(down >= last_up.get(m, -1.0), f"Cluster.failures[{i}] down_at_s", down,
              f">= the previous up_at_s of learner {m} ({last_up.get(m)}): windows of one learner "
              "must be sorted and must not overlap")
        last_up[m] = up


class Timeline:
    """Step durations and failure windows of M learners, generated lazily and deterministically
    (learner m's k-th step always takes the same time, whatever was asked before)."""

    CHUNK = 1024

    def __init__(self, cluster: Cluster | None, learners: int):
        c = cluster if cluster is not None else Cluster()
        c.check_learners(learners)
        self.cluster, self.learners = c, learners
        base = np.broadcast_to(np.asarray(c.step_time_s, float), (learners,)).copy()
        if c.speed_spread > 0:
            z = np.random.default_rng([c.seed, 0]).standard_normal(learners)
            base = base * np.exp(c.speed_spread * z)
        self.nominal = base  # each learner's step time before jitter
        self.t_ref = float(np.median(base))  # the syncer's "reference step"
        self._durations: list[np.ndarray] = [np.empty(0) for _ in range(learners)]
        self._rngs = [np.random.default_rng([c.seed, 1, m]) for m in range(learners)]
        if isinstance(c.failures, FailureRate):
            self._fail_rngs = [np.random.default_rng([c.seed, 2, m]) for m in range(learners)]
            self._windows = [[] for _ in range(learners)]
        else:
            self._fail_rngs = None
            self._windows = [[(d, u) for mm, d, u in c.failures if mm == m]
                             for m in range(learners)]

    def duration(self, m: int, k: int) -> float:
        """Seconds of learner m's step with own index k (0-based)."""
        d = self._durations[m]
        while k >= d.size:
            u = self._rngs[m].uniform(-1.0, 1.0, self.CHUNK) if self.cluster.jitter else 0.0
            more = self.nominal[m] * (1.0 + self.cluster.jitter * np.broadcast_to(u, self.CHUNK))
            d = self._durations[m] = np.concatenate([d, more])
        return float(d[k])

    def window(self, m: int, i: int) -> tuple[float, float] | None:
        """Learner m's i-th failure window (down_at, up_at), or None when there is no such one."""
        w = self._windows[m]
        if self._fail_rngs is not None:
            rate = self.cluster.failures
            while len(w) <= i:
                start = w[-1][1] if w else 0.0
                down = start + float(self._fail_rngs[m].exponential(rate.mtbf_s))
                w.append((down, down + rate.down_s))
        return w[i] if i < len(w) else None

    def offered_steps(self, elapsed_s: float) -> float:
        """Learner-steps the cluster could have done in `elapsed_s` at nominal speed."""
        return float(np.sum(elapsed_s / self.nominal))


class Links:
    """The per-host links of Decoupled DiLoCo's messages (module docstring): hosts 0 (the
    syncer) to `learners`, each with its own `link`. `send` books a message and returns when it
    arrives; `fan_out` the syncer's copies of one."""

    def __init__(self, link: Link, learners: int):
        self.link = link
        self.tx = [0.0] * (learners + 1)  # when each host's sending side is free
        self.rx = [0.0] * (learners + 1)  # ... its receiving side

    def send(self, a: int, b: int, nbytes: float, t: float) -> float:
        """A message of `nbytes` from host a to host b, ready at t: its arrival."""
        end = max(t, self.tx[a], self.rx[b]) + self.link.busy_s(nbytes)
        self.tx[a] = self.rx[b] = end
        return end + self.link.latency_s

    def fan_out(self, to, nbytes: float, t: float, *, book: bool = True) -> list[float]:
        """The syncer's copies of one message to learners `to`, one after the other in that
        order, ready at t: their arrivals (`book`: False to only predict them)."""
        tx, rx = self.tx[0], list(self.rx)
        out = [self.send(0, m + 1, nbytes, t) for m in to]
        if not book:
            self.tx[0], self.rx = tx, rx
        return out
