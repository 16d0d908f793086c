"""Closed forms for goodput under Poisson failures, next to the simulator in `goodput`.

Every scheme in `goodput` is a set of independent *failure domains* (the whole job, or one
learner). One domain with failure rate `lam` (per second) lives through this cycle:

    run: work `interval_s`, then a blocking commit of `commit_s` (checkpoint / sync); repeat.
    a failure: the work since the last commit is lost, then recovery:
        `absorbed_s` (detect + reschedule): further failures are folded into it;
        `exposed_s`  (reload / rejoin): a failure here starts the recovery again.

Renewal-reward arithmetic gives the long-run fraction of time spent on committed work:

    W = (absorbed_s + (1 − e^(−λ·exposed_s)) / λ) · e^(λ·exposed_s)       expected recovery
    G = interval_s / ((e^(λ·(interval_s + commit_s)) − 1) · (1/λ + W))    domain goodput

(with `absorbed_s = 0` this is the classic "restarts exposed to failures" result). Independent
islands: M learners, each with rate λ/M, give G(λ/M) each, so the whole is G(λ/M), and with
equal recovery cost and no commits G = e^(−λR) turns into G_sync^(1/M) (docs/algorithms.md §5).
"""

from __future__ import annotations

import math

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (standard tables).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young (1974): the checkpoint interval sqrt(2·δ·MTBF) that minimizes expected waste."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum of the compute time between checkpoints.

    sqrt(2δM)·(1 + sqrt(δ/2M)/3 + δ/(18M)) − δ for δ < 2M, else M. It corrects Young's rule
    when the checkpoint cost δ is not small next to the MTBF M, which is the case at 1M chips.
    """
    d, m = checkpoint_s, mtbf_s
    if d >= 2.0 * m:
        return m
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(d / (2.0 * m)) / 3.0 + d / (18.0 * m)) - d


def recovery_time(rate: float, absorbed_s: float, exposed_s: float) -> float:
    """Expected time from a failure until the domain runs again (W in the module docstring)."""
    return (absorbed_s + -math.expm1(-rate * exposed_s) / rate) * math.exp(rate * exposed_s)


def up_fraction(rate: float, absorbed_s: float, exposed_s: float) -> float:
    """Long-run fraction of time a domain is running (not recovering): (1/λ) / (1/λ + W)."""
    return 1.0 / (1.0 + rate * recovery_time(rate, absorbed_s, exposed_s))


def domain_goodput(rate: float, interval_s: float, commit_s: float, absorbed_s: float,
                   exposed_s: float) -> float:
    """Long-run fraction of one domain's time spent on committed work (G in the docstring)."""
    cycles = math.expm1(rate * (interval_s + commit_s))
    return interval_s / (cycles * (1.0 / rate + recovery_time(rate, absorbed_s, exposed_s)))


def optimal_interval(rate: float, commit_s: float, absorbed_s: float, exposed_s: float) -> float:
    """The interval that maximizes `domain_goodput`, by golden-section search (for checks)."""
    f = lambda t: -domain_goodput(rate, t, commit_s, absorbed_s, exposed_s)
    lo, hi = 1e-6 / rate, 20.0 / rate
    inv = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(200):
        a, b = hi - inv * (hi - lo), lo + inv * (hi - lo)
        lo, hi = (lo, b) if f(a) < f(b) else (a, hi)
    return 0.5 * (lo + hi)


def quorum_probability(up: float, others: int, needed: int) -> float:
    """P(at least `needed` of `others` independent learners are up), each up with prob. `up`."""
    return sum(math.comb(others, j) * up**j * (1.0 - up) ** (others - j)
               for j in range(max(needed, 0), others + 1))


def islands_goodput(learner_goodput: float, learner_up: float, learners: int,
                    quorum: int) -> float:
    """Independent islands with a syncer quorum K: a learner's committed work counts only
    while at least K learners (itself included) are up. Learners are independent and a
    learner's own state is independent of the others', so this is exact:
    G = g · P(at least K−1 of the other M−1 are up)."""
    return learner_goodput * quorum_probability(learner_up, learners - 1, quorum - 1)


def t_quantile_975(df: int) -> float:
    """Two-sided 95% Student-t quantile (table up to 30 degrees of freedom, then a series)."""
    if df < 1:
        raise ValueError(f"df={df!r} is invalid: must be an integer >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
