"""The bandwidth simulator: closed forms, monotonicity, the search, and a scalar reference loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco_lite.config import DDP, DecoupledDiLoCo, DiLoCo, StreamingDiLoCo
from diloco_lite.systems import bandwidth as bw
from diloco_lite.systems import bandwidth_report as report

N, T = 1e10, 1.6  # 10B parameters, 1.6 s per step
RES = bw.RESOLUTION
ALGS = [
    DDP(),
    DiLoCo(inner_steps=10),
    StreamingDiLoCo(inner_steps=12, fragments=5, overlap=3, bits=8),
    StreamingDiLoCo(inner_steps=6, fragments=9, overlap=5, bits=4),
    DecoupledDiLoCo(),
    DecoupledDiLoCo(inner_steps=10, fragments=3, overlap=9, bits=16),
]


def util(alg, b, **kw):
    kw = {"n_params": N, "step_time_s": T, **kw}
    return bw.compute_utilization(alg, bandwidth_gbps=b, **kw)


def required(alg, u, **kw):
    kw = {"n_params": N, "step_time_s": T, **kw}
    return bw.required_bandwidth(alg, target_utilization=u, **kw)


def ddp_stall(payload_bits, b_gbps, t, buckets=bw.BUCKETS, latency=0.0):
    """Closed form: a burst that outlasts the backward pass stalls by its transfer time minus the
    part hidden behind the backward pass; otherwise only the last bucket shows."""
    transfer = payload_bits / (b_gbps * 1e9)
    hidden = (2 * t / 3) * (1 - 1 / buckets)
    return max(transfer - hidden, transfer / buckets) + latency


# --------------------------------------------------------------------------------------------
# Closed-form limits
# --------------------------------------------------------------------------------------------


def test_infinite_bandwidth_gives_full_utilization():
    for alg in ALGS:
        assert util(alg, math.inf) == 1.0
    assert util(DDP(), 1e12) == pytest.approx(1.0, abs=1e-6)
    assert util(DDP(), math.inf, latency_s=0.4) == pytest.approx(T / (T + 0.4), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    b=st.floats(0.5, 5000.0),
    replicas=st.integers(2, 16),
    grad_bits=st.sampled_from([16, 32]),
    buckets=st.integers(1, 64),
    latency=st.floats(0.0, 0.5),
    t=st.floats(0.1, 5.0),
)
def test_ddp_stall_matches_closed_form(b, replicas, grad_bits, buckets, latency, t):
    payload = N * grad_bits * 2 * (replicas - 1) / replicas
    u = bw.compute_utilization(
        DDP(),
        n_params=N,
        step_time_s=t,
        bandwidth_gbps=b,
        replicas=replicas,
        grad_bits=grad_bits,
        buckets=buckets,
        latency_s=latency,
    )
    assert u == pytest.approx(t / (t + ddp_stall(payload, b, t, buckets, latency)), rel=1e-10)


def test_diloco_needs_about_h_times_less_than_ddp():
    """Exact relation of this model, latency 0, while the burst outlasts the backward pass:
    S/B_diloco - h = H * (S/B_ddp - h), h = (2T/3)(1 - 1/buckets), both sides = allowed stall.
    So B_ddp / B_diloco = (H a + h) / (a + h) with a = T(1-u)/u: exactly H when h = 0."""
    s = N * 16 * 1.0  # 2 replicas: ring factor 1
    h = (2 * T / 3) * (1 - 1 / bw.BUCKETS)
    for H in (5, 50):
        for u in (0.5, 0.8, 0.9):
            a = T * (1 - u) / u
            b_ddp, b_dil = required(DDP(), u), required(DiLoCo(inner_steps=H), u)
            assert s / 1e9 / (a + h) <= b_ddp <= s / 1e9 / (a + h) * (1 + RES)
            assert s / 1e9 / (H * a + h) <= b_dil <= s / 1e9 / (H * a + h) * (1 + RES)
            ratio = b_ddp / b_dil
            assert ratio == pytest.approx((H * a + h) / (a + h), rel=2 * RES)
    # One bucket: nothing hides behind the backward pass (h = 0), so the ratio is exactly H.
    for u in (0.5, 0.9):
        ratio = required(DDP(), u, buckets=1) / required(DiLoCo(inner_steps=40), u, buckets=1)
        assert ratio == pytest.approx(40, rel=2 * RES)


def test_streaming_fragments_lower_the_peak_p_times():
    """Each of the P bursts of Streaming (tau = 0) is P times smaller, so at bandwidth B/P it
    stalls exactly as long as DiLoCo's one burst at B: 1/u_s(B/P) - 1 = P (1/u_d(B) - 1)."""
    H, P = 20, 4
    stream = StreamingDiLoCo(inner_steps=H, fragments=P, overlap=0, bits=16)
    for b in (1.0, 10.0, 100.0, 1000.0):
        lhs = 1 / util(stream, b / P) - 1
        rhs = P * (1 / util(DiLoCo(inner_steps=H), b) - 1)
        assert lhs == pytest.approx(rhs, rel=1e-9)
    # Required bandwidth, exact in this model while each burst outlasts the backward pass:
    # S/B_s = P (tau T + h) + A and S/B_d = h + A, with A = H T (1-u)/u the stall allowed per
    # period. So B_d / B_s -> P as A -> 0 (tau = 0), and overlap buys another 1 + tau T / h.
    H, P, s = 100, 4, N * 16
    h = (2 * T / 3) * (1 - 1 / bw.BUCKETS)
    for u in (0.9, 0.99):
        a = H * T * (1 - u) / u
        b_d = required(DiLoCo(inner_steps=H), u)
        assert s / 1e9 / (h + a) <= b_d <= s / 1e9 / (h + a) * (1 + RES)
        for tau in (0, 1, 2):
            b_s = required(StreamingDiLoCo(inner_steps=H, fragments=P, overlap=tau, bits=16), u)
            exact = s / 1e9 / (P * (tau * T + h) + a)
            assert exact <= b_s <= exact * (1 + RES)


def test_four_bits_need_four_times_less_than_sixteen():
    for make in (StreamingDiLoCo, lambda bits: DecoupledDiLoCo(bits=bits, down_bits=bits)):
        b4 = required(make(bits=4), 0.9)
        b16 = required(make(bits=16), 0.9)
        assert b16 / b4 == pytest.approx(4, rel=2 * RES)
        assert util(make(bits=4), 0.3) == pytest.approx(util(make(bits=16), 1.2), rel=1e-12)


def test_decoupled_reply_shares_the_link_the_busier_direction_counts():
    up4 = DecoupledDiLoCo(bits=4, down_bits=4)
    assert required(DecoupledDiLoCo(bits=4, down_bits=32), 0.9) == pytest.approx(
        8 * required(up4, 0.9), rel=2 * RES)
    assert required(DecoupledDiLoCo(bits=16, down_bits=4), 0.9) == pytest.approx(
        4 * required(up4, 0.9), rel=2 * RES)
    assert required(DDP(), 0.8, grad_bits=32) / required(DDP(), 0.8) == pytest.approx(
        2, rel=2 * RES
    )


@pytest.mark.parametrize("replicas", [2, 3, 8, 64])
def test_ring_factor(replicas):
    factor = 2 * (replicas - 1) / replicas
    for b in (10.0, 300.0):
        assert util(DDP(), b, replicas=replicas) == pytest.approx(
            util(DDP(), b / factor), rel=1e-12
        )
    # Decoupled uploads to the syncer: no ring, the replica count does not enter.
    assert util(DecoupledDiLoCo(), 0.5, replicas=replicas) == util(DecoupledDiLoCo(), 0.5)


def test_one_replica_sends_nothing():
    assert util(DDP(), 1e-6, replicas=1, latency_s=1.0) == 1.0
    assert required(DiLoCo(), 0.99, replicas=1) == 0.0


def test_latency_adds_to_every_blocking_sync():
    for b in (50.0, 500.0):
        for lat in (0.01, 0.3):
            no, yes = util(DDP(), b), util(DDP(), b, latency_s=lat)
            assert 1 / yes - 1 == pytest.approx(1 / no - 1 + lat / T, rel=1e-10)
            no, yes = (
                util(DiLoCo(inner_steps=10), b),
                util(DiLoCo(inner_steps=10), b, latency_s=lat),
            )
            assert 1 / yes - 1 == pytest.approx(1 / no - 1 + lat / (10 * T), rel=1e-10)
    # With overlap, latency is hidden while it fits in the slack of tau steps.
    dec = DecoupledDiLoCo()
    assert util(dec, 100.0, latency_s=0.5) == util(dec, 100.0) == 1.0
    assert util(dec, 100.0, latency_s=3 * T) < 1.0


def test_unreachable_target_is_inf():
    assert required(DDP(), 0.6, latency_s=T) == math.inf  # latency alone caps it at 50%


# --------------------------------------------------------------------------------------------
# Monotonicity and the search
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a.name)
@pytest.mark.parametrize("latency", [0.0, 0.5])
def test_utilization_monotone_in_bandwidth(alg, latency):
    grid = np.geomspace(1e-3, 1e4, 600)
    u = bw.utilization_curve(
        alg, n_params=N, step_time_s=T, bandwidths_gbps=grid, replicas=3, latency_s=latency
    )
    assert np.all((u >= 0) & (u <= 1))
    assert np.all(np.diff(u) >= -1e-12)


@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a.name)
@pytest.mark.parametrize("target", [0.3, 0.8, 0.95])
def test_required_bandwidth_reaches_target_within_resolution(alg, target):
    kw = {"replicas": 8, "latency_s": 0.05}
    b = required(alg, target, **kw)
    assert util(alg, b, **kw) >= target
    assert util(alg, b * (1 - RES), **kw) < target


# --------------------------------------------------------------------------------------------
# Vectorized == scalar reference loop; the default window is the steady state
# --------------------------------------------------------------------------------------------


def reference_utilization(alg, n, t, b_gbps, replicas, grad_bits, latency, buckets, steps):
    """Step by step, bucket by bucket, straight from the module docstring (no numpy)."""
    ring = 2 * (replicas - 1) / replicas
    if isinstance(alg, DDP):
        period, due, bits, tau = 1, {0: 1.0}, grad_bits * ring, 0
    elif isinstance(alg, DiLoCo):
        period, due, bits, tau = alg.inner_steps, {alg.inner_steps - 1: 1.0}, grad_bits * ring, 0
    else:
        period, tau = alg.inner_steps, alg.overlap
        if isinstance(alg, DecoupledDiLoCo):
            bits = max(alg.bits, alg.down_bits)  # up and down on one full-duplex link
        else:
            bits = alg.bits * ring
        due = {}
        for p in range(alg.fragments):  # fragment p goes after step (p+1)·H/P, 1-based
            o = ((p + 1) * period // alg.fragments - 1) % period
            due[o] = due.get(o, 0.0) + 1 / alg.fragments
    periods = max(2, -(-steps // period))
    measured = periods // 2
    bps = b_gbps * 1e9
    stall, link, arrival, start_stall = 0.0, -math.inf, {}, None
    for k in range(periods * period):
        if k == (periods - measured) * period:
            start_stall = stall
        s = k * t + stall
        frac = due.get(k % period, 0.0)
        if frac and n * bits > 0:
            size = frac * n * bits / buckets
            for j in range(buckets):
                ready = s + t / 3 + (j + 1) * (2 * t / 3) / buckets
                link = max(link, ready) + size / bps
            arrival[k] = link + latency
        if k - tau in arrival:
            stall += max(0.0, arrival.pop(k - tau) - (s + t))
    compute = measured * period * t
    return compute / max(compute + stall - start_stall, measured * n * bits / bps)


@settings(max_examples=40, deadline=None)
@given(
    alg=st.sampled_from(ALGS),
    b=st.floats(1e-3, 1e4),
    replicas=st.integers(1, 9),
    latency=st.floats(0.0, 3.0),
    buckets=st.integers(1, 12),
    t=st.floats(0.05, 4.0),
)
def test_vectorized_equals_scalar_reference(alg, b, replicas, latency, buckets, t):
    steps = 5 * (1 if isinstance(alg, DDP) else alg.inner_steps)
    fast = bw.compute_utilization(
        alg,
        n_params=N,
        step_time_s=t,
        bandwidth_gbps=b,
        replicas=replicas,
        latency_s=latency,
        buckets=buckets,
        steps=steps,
    )
    ref = reference_utilization(alg, N, t, b, replicas, 16, latency, buckets, steps)
    assert fast == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("alg", ALGS, ids=lambda a: a.name)
def test_curve_and_default_window_match_long_runs(alg):
    grid = np.geomspace(1e-2, 1e3, 25)
    curve = bw.utilization_curve(
        alg, n_params=N, step_time_s=T, bandwidths_gbps=grid, latency_s=0.2
    )
    period = 1 if isinstance(alg, DDP) else alg.inner_steps
    for b, u in zip(grid, curve, strict=True):
        assert u == util(alg, b, latency_s=0.2)
        assert u == pytest.approx(util(alg, b, latency_s=0.2, steps=300 * period), abs=1e-9)


def test_bench_sweep_covers_every_case():
    """(Its speed is `make bench`'s business, not a test's.)"""
    out = bw.bench_sweep()
    assert out["cases"] == len(bw.SWEEP_METHODS) * len(bw.SWEEP_MODELS) * len(bw.SWEEP_TARGETS)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_params": 0}, "n_params"),
        ({"n_params": -1e9}, "n_params"),
        ({"step_time_s": 0.0}, "step_time_s"),
        ({"step_time_s": -1.0}, "step_time_s"),
        ({"bandwidth_gbps": 0.0}, "bandwidth_gbps"),
        ({"bandwidth_gbps": -3.0}, "bandwidth_gbps"),
        ({"bandwidth_gbps": float("nan")}, "bandwidth_gbps"),
        ({"replicas": 0}, "replicas"),
        ({"latency_s": -0.1}, "latency_s"),
        ({"steps": 0}, "steps"),
        ({"buckets": 0}, "buckets"),
    ],
)
def test_compute_utilization_rejects_bad_input(kwargs, field):
    kw = {"n_params": N, "step_time_s": T, "bandwidth_gbps": 10.0, **kwargs}
    with pytest.raises(ValueError, match=f"^{field}=.* is invalid: must be"):
        bw.compute_utilization(DDP(), **kw)


@pytest.mark.parametrize("target", [0.0, 1.0, 1.5, -0.2, float("nan")])
def test_required_bandwidth_rejects_bad_target(target):
    with pytest.raises(ValueError, match="^target_utilization=.* is invalid: must be a number in"):
        required(DDP(), target)


def test_unknown_algorithm_is_rejected():
    with pytest.raises(ValueError, match="^algorithm='ddp' is invalid"):
        bw.compute_utilization("ddp", n_params=N, step_time_s=T, bandwidth_gbps=1.0)
    with pytest.raises(ValueError, match="^algorithm="):
        required(object(), 0.5)


# --------------------------------------------------------------------------------------------
# The 198 -> 0.84 reconstruction
# --------------------------------------------------------------------------------------------


def test_reconstruction_is_close_to_published():
    table = report.comparison_table().set_index("method")
    assert table.loc["ddp", "ours / published"] == pytest.approx(1, abs=0.02)
    assert table.loc["decoupled_diloco", "ours / published"] == pytest.approx(1, abs=0.02)
    # The closed form of the module docstring: ratio = 168 / (1 - u + u h/T).
    d = report.DEFAULT
    h = (2 / 3) * (1 - 1 / d.buckets)
    closed = 1.75 * 4 * 24 / (1 - d.target_utilization + d.target_utilization * h)
    assert table.loc["ratio ddp / decoupled", "ours_gbps"] == pytest.approx(closed, rel=2 * RES)


def test_sensitivity_moves_what_it_should():
    s = report.sensitivity()
    change = s.set_index(["setting", "method"])["change"]
    assert change["n_params=24B", "ddp"] == pytest.approx(2, rel=2 * RES)
    assert change["n_params=24B", "decoupled_diloco"] == pytest.approx(2, rel=2 * RES)
    assert change["bits=16", "decoupled_diloco"] == pytest.approx(4, rel=2 * RES)
    for setting in ("bits=16", "inner_steps=48", "overlap=0", "fragments=6"):
        assert change[setting, "ddp"] == 1.0  # DDP ignores Decoupled's settings
    for setting in ("grad_bits=32", "datacenters=16", "latency_s=0.2", "buckets=1"):
        assert change[setting, "decoupled_diloco"] == 1.0  # and the reverse
    assert s.groupby("assumption").is_default.sum().eq(2).all()  # default present once per method


def test_reproduce_job_rows(tmp_path):
    """The rows carry the reconstruction's numbers, and those follow the closed forms of the
    module docstring (not a value the report computed): B_ddp = u·S/(T(1−u) + u·h) with
    S = n·16·1.75 bits and h = (2T/3)(1 − 1/32); B_dec = u·n·4/24 bits per step / T."""
    rows = report.reproduce_job(tmp_path, quick=True)
    keys = {"experiment", "method", "metric", "value", "published", "config"}
    assert rows and all(set(r) == keys and r["experiment"] == "bandwidth" for r in rows)
    ours = {r["method"]: r["value"] for r in rows if r["metric"] == report.METRIC}
    n, t, u = 12e9, 1.9, 0.8
    s, h = n * 16 * 2 * 7 / 8, (2 * t / 3) * (1 - 1 / 32)
    assert ours["ddp"] == pytest.approx(u * s / (t * (1 - u) + u * h) / 1e9, rel=2 * RES)
    assert ours["decoupled_diloco"] == pytest.approx(u * n * 4 / 24 / t / 1e9, rel=2 * RES)
    # ... which is the published pair, within 1%
    assert ours["ddp"] == pytest.approx(198, rel=0.01)
    assert ours["decoupled_diloco"] == pytest.approx(0.84, rel=0.01)
    speedups = [r["value"] for r in rows if r["metric"].startswith("wall-clock speed-up")]
    assert len(speedups) == 4 and all(x > 20 for x in speedups)
    for name in ("bandwidth_utilization", "bandwidth_required", "bandwidth_sensitivity"):
        assert (tmp_path / f"{name}.svg").exists() and (tmp_path / f"{name}.png").exists()
