"""The goodput chaos simulator: closed forms, limits, invariances, bookkeeping, bad input."""

import dataclasses
import math

import numpy as np
import pytest

from diloco_lite.systems import goodput_closed as cf
from diloco_lite.systems.goodput import (
    BUCKETS,
    SCHEMES,
    ChaosConfig,
    domain,
    expected_goodput,
    simulate,
    simulate_interval,
    timeline,
)

DEFAULT = ChaosConfig()
NO_FAILURES = dict(mtbi_chip_years=1e12)
CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)


@pytest.mark.parametrize(
    "scheme, learners, quorum",
    [("dp", 1, 1), ("elastic_dp", 1, 1), ("decoupled", 2, 1), ("decoupled", 8, 1),
     ("decoupled", 4, 3)],
)
def test_simulation_agrees_with_closed_form_within_its_interval(scheme, learners, quorum):
    iv = simulate_interval(scheme, DEFAULT, learners=learners, quorum=quorum, days=4, seeds=8)
    expected = expected_goodput(scheme, DEFAULT, learners=learners, quorum=quorum)
    assert iv.low <= expected <= iv.high, (iv.low, expected, iv.high)
    assert iv.high - iv.low < 0.01  # the interval is tight enough to mean something
    assert iv.low < iv.mean < iv.high and len(iv.results) == 8


def test_expected_goodput_from_the_raw_fields():
    c, lam = DEFAULT, DEFAULT.failure_rate
    assert lam == pytest.approx(1.2e6 / (365.25 * 86400))
    dp = cf.domain_goodput(lam, c.dp_checkpoint_interval, c.checkpoint_s,
                           c.detect_s + c.reschedule_s, c.reload_s)
    learner = cf.domain_goodput(lam / 8, c.sync_steps * c.step_s, c.sync_s,
                                c.detect_s + c.learner_reschedule_s, c.rejoin_s)
    assert expected_goodput("dp", c) == pytest.approx(dp, rel=1e-12)
    assert expected_goodput("decoupled", c, learners=8) == pytest.approx(learner, rel=1e-12)
    # The calibration targets (docs/algorithms.md §7): dp 27%, elastic dp 58%, decoupled M=8 88%.
    assert expected_goodput("dp", c) == pytest.approx(0.27, abs=0.01)
    assert expected_goodput("elastic_dp", c) == pytest.approx(0.58, abs=0.01)
    assert learner == pytest.approx(0.88, abs=0.01)


def test_no_failures_gives_the_compute_fraction():
    # 86400 s is exactly 1440 cycles of 58 s work + 2 s checkpoint.
    chaos = ChaosConfig(**NO_FAILURES, checkpoint_interval_s=58.0, checkpoint_s=2.0)
    r = simulate("dp", chaos, days=1)
    assert r.failures == 0
    assert r.goodput == pytest.approx(58 / 60, rel=1e-12)
    assert r.buckets["checkpoint"] == pytest.approx(86400 * 2 / 60, rel=1e-12)
    for scheme in ("elastic_dp", "decoupled"):
        assert simulate(scheme, chaos, days=1).goodput == 1.0


def test_one_learner_with_restart_costs_is_dp_exactly():
    c = DEFAULT
    same = dataclasses.replace(
        c, learner_reschedule_s=c.reschedule_s, rejoin_s=c.reload_s, sync_s=c.checkpoint_s,
        checkpoint_interval_s=c.sync_steps * c.step_s)
    for seed in (0, 1):
        dp = simulate("dp", same, seed=seed, days=2)
        one = simulate("decoupled", same, learners=1, seed=seed, days=2)
        assert one.goodput == dp.goodput
        assert one.buckets["rejoin"] == dp.buckets["restart"]
        assert one.failures == dp.failures
    # With the default (cheaper) learner recovery one learner already beats dp.
    assert simulate("decoupled", c, learners=1, days=2).goodput > simulate("dp", c, days=2).goodput


@pytest.mark.parametrize("scheme", ["dp", "decoupled"])
def test_doubling_chips_and_mtbi_changes_nothing(scheme):
    a = simulate(scheme, DEFAULT, days=2, seed=3)
    b = simulate(scheme, dataclasses.replace(DEFAULT, chips=2_400_000, mtbi_chip_years=2.0),
                 days=2, seed=3)
    assert a.goodput == b.goodput and a.buckets == b.buckets


def test_doubling_chips_and_mtbi_elastic_changes_only_the_missing_replica_share():
    # The failure rate is the same; only the share of chips one failure takes out halves.
    big = dataclasses.replace(DEFAULT, chips=2_400_000, mtbi_chip_years=2.0)
    a, b = (simulate("elastic_dp", c, days=2, seed=3) for c in (DEFAULT, big))
    assert a.failures == b.failures
    assert b.buckets["down"] == pytest.approx(a.buckets["down"] / 2, rel=0.05)
    assert b.goodput - a.goodput == pytest.approx(
        expected_goodput("elastic_dp", big) - expected_goodput("elastic_dp", DEFAULT), abs=1e-3)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_goodput_falls_with_chips(scheme):
    g = [simulate(scheme, dataclasses.replace(DEFAULT, chips=n), days=2).goodput for n in CHIPS]
    assert all(np.diff(g) < 0), g


def test_goodput_never_falls_when_learners_are_added():
    for chips in (300_000, 2_400_000):
        chaos = dataclasses.replace(DEFAULT, chips=chips)
        g = [simulate("decoupled", chaos, learners=m, days=2).goodput for m in (1, 2, 4, 8, 16, 32)]
        assert all(np.diff(g) >= 0), g
        assert g[-1] - g[0] > 0.2  # smaller failure domains really help


@pytest.mark.parametrize(
    "scheme, learners, quorum",
    [("dp", 1, 1), ("elastic_dp", 8, 2), ("decoupled", 8, 1), ("decoupled", 3, 3)],
)
def test_buckets_sum_to_wall_time(scheme, learners, quorum):
    chaos = dataclasses.replace(DEFAULT, chips=2_400_000)
    r = simulate(scheme, chaos, learners=learners, quorum=quorum, days=1.5)
    assert set(r.buckets) == set(BUCKETS)
    assert sum(r.buckets.values()) == pytest.approx(r.wall_s, rel=1e-9)
    assert min(r.buckets.values()) >= 0
    assert 0 <= r.goodput <= 1 and 0 <= r.uptime <= 1
    assert r.learners == (learners if scheme == "decoupled" else 1)
    booked = {"dp": "restart", "elastic_dp": "down", "decoupled": "rejoin"}[scheme]
    assert r.buckets[booked] > 0
    assert (r.buckets["waiting"] > 0) == (scheme == "decoupled" and quorum > 1)


def test_same_seed_same_numbers():
    for scheme in SCHEMES:
        a, b = (simulate(scheme, DEFAULT, days=1, seed=7) for _ in range(2))
        assert a == b
        assert simulate(scheme, DEFAULT, days=1, seed=8).goodput != a.goodput


def test_young_daly_interval_is_the_optimum_of_the_closed_form():
    for chips in (150_000, 1_200_000, 2_400_000):
        d = domain("dp", dataclasses.replace(DEFAULT, chips=chips))
        best = cf.optimal_interval(d.rate, d.commit_s, d.absorbed_s, d.exposed_s)
        assert d.interval_s == pytest.approx(best, rel=0.01)
        young = cf.young_interval(d.commit_s, 1 / d.rate)
        assert young > d.interval_s  # Daly's correction shortens Young's rule at high rates
    assert cf.daly_interval(1.0, 1e6) == pytest.approx(cf.young_interval(1.0, 1e6), rel=1e-3)


def test_equal_cost_islands_give_the_mth_root():
    lam, restart = DEFAULT.failure_rate, 30.0
    sync = cf.domain_goodput(lam, 1e-9, 0.0, 0.0, restart)
    assert sync == pytest.approx(math.exp(-lam * restart), rel=1e-6)
    for m in (2, 8):
        island = cf.domain_goodput(lam / m, 1e-9, 0.0, 0.0, restart)
        assert cf.islands_goodput(island, 1.0, m, 1) == pytest.approx(sync ** (1 / m), rel=1e-6)


def test_decoupled_syncer_keeps_quorum_from_four_learners():
    for m in (4, 8, 16):
        assert simulate("decoupled", DEFAULT, learners=m, days=2).uptime > 0.999
    assert simulate("dp", DEFAULT, days=2).uptime < 0.5


def test_timeline_tiles_each_domain():
    rows = timeline("decoupled", DEFAULT, learners=4, hours=1.0)
    assert {r["state"] for r in rows} == {"up", "down", "recovering"}
    for d in range(4):
        mine = [r for r in rows if r["domain"] == d]
        assert mine[0]["start_s"] == 0.0 and mine[-1]["end_s"] == 3600.0
        assert all(a["end_s"] == b["start_s"] for a, b in zip(mine, mine[1:], strict=False))


@pytest.mark.parametrize(
    "field, value",
    [("chips", 0), ("chips", -5), ("chips", 1.5), ("mtbi_chip_years", 0.0),
     ("mtbi_chip_years", -1.0), ("detect_s", 0.0), ("reschedule_s", -3.0), ("reload_s", 0),
     ("checkpoint_s", -1.0), ("checkpoint_interval_s", 0.0), ("step_s", float("nan")),
     ("reconfigure_s", 0.0), ("replacement_s", -1.0), ("learner_reschedule_s", 0.0),
     ("rejoin_s", -2.0), ("replica_chips", 0), ("replica_chips", 2_000_000),
     ("sync_steps", 0), ("sync_s", -0.5)],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"ChaosConfig.{field}="):
        ChaosConfig(**{field: value})


def test_bad_run_arguments_name_the_argument():
    with pytest.raises(ValueError, match="quorum"):
        simulate("decoupled", DEFAULT, learners=4, quorum=5)
    with pytest.raises(ValueError, match="scheme"):
        simulate("ring_allreduce", DEFAULT)
    with pytest.raises(ValueError, match="learners"):
        simulate("decoupled", DEFAULT, learners=0)
    with pytest.raises(ValueError, match="days"):
        simulate("dp", DEFAULT, days=0)
    with pytest.raises(ValueError, match="seeds"):
        simulate_interval("dp", DEFAULT, seeds=[0])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_without_failures_only_checkpoints_cost_goodput(scheme):
    """A run's end is not a failure: with failures vanishingly rare every scheme keeps ≥ 99%
    (dp pays only its checkpoints; Daly's interval is then longer than the week)."""
    calm = ChaosConfig(mtbi_chip_years=1e9)
    r = simulate(scheme, calm, learners=8, days=7)
    assert r.goodput >= 0.99, (scheme, r.buckets)
    assert r.buckets["lost"] == pytest.approx(0.0, abs=1e-6 * r.wall_s)
