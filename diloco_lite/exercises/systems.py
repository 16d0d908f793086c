"""Checks for notebooks 05 (bandwidth) and 06 (goodput): numbers worked out by hand.

References: `diloco_lite.systems.bandwidth` (the simulator, not the closed form the student writes)
and `diloco_lite.systems.goodput_closed`. The classic wrong answers are closed forms with one piece
missing; a check names the piece.
"""

from __future__ import annotations

import math

from ..config import DDP, DecoupledDiLoCo
from ..systems import bandwidth as bw
from ..systems import goodput_closed as closed
from ._core import Result, attempt, exercise, fmt, judge, number

SECONDS_PER_YEAR = 365.25 * 86400.0
BW_RTOL = 3 * bw.RESOLUTION  # the simulator's search is exact to 0.1%


@exercise("DDP bandwidth", todo="the slowest link, in Gbit/s, at which DDP still reaches "
                                 "the target compute utilization u")
def check_ddp_bandwidth(predicted_gbps, *, n_params: float = 10e9, step_time_s: float = 1.6,
                        replicas: int = 8, target_utilization: float = 0.9,
                        grad_bits: int = 16) -> Result:
    """`predicted_gbps`: the link speed DDP needs to reach `target_utilization`."""
    n, t, r, u = n_params, step_time_s, replicas, target_utilization
    ring = 2 * (r - 1) / r
    hidden = 2 * t / 3 * (1 - 1 / bw.BUCKETS)
    stall = t * (1 - u) / u

    def gbps(bits_per_step, seconds):
        return bits_per_step / seconds / 1e9

    ref = bw.required_bandwidth(DDP(), n_params=n, step_time_s=t, target_utilization=u,
                                replicas=r, grad_bits=grad_bits)
    on_wire = n * grad_bits * ring
    return judge(number(predicted_gbps), ref, rtol=BW_RTOL,
                 success=f"{ref:.1f} Gbit/s (the simulator agrees to 0.1%)", mistakes=[
        ("no_ring", gbps(n * grad_bits, hidden + stall), f"a ring all-reduce moves "
         f"2(R−1)/R = {ring:g} times the payload through each link"),
        ("ring_2", gbps(2 * n * grad_bits, hidden + stall), f"the ring factor is 2(R−1)/R = "
         f"{ring:g} for R = {r}, not 2"),
        ("fp32", gbps(n * 32 * ring, hidden + stall), f"gradients travel in bf16: {grad_bits} "
         "bits each, not 32"),
        ("bytes", gbps(on_wire / 8, hidden + stall), "that is in GB/s: links are rated in "
         "Gbit/s (× 8)"),
        ("no_hiding", gbps(on_wire, stall), "part of the transfer hides behind the backward "
         "pass: all buckets but the last, (2T/3)(1 − 1/32), before any stall"),
        ("all_hidden", gbps(on_wire, 2 * t / 3 + stall), "the last bucket is released when the "
         "backward pass ends, so it cannot hide: use (2T/3)(1 − 1/32), not 2T/3"),
        ("hide_all", gbps(on_wire, 2 * t / 3), f"that bandwidth hides the whole transfer "
         f"behind the backward pass; at {u:.0%} utilization each step may also stall "
         f"T(1 − u)/u = {stall:.3f} s, and the last bucket never hides"),
        ("no_stall", gbps(on_wire, hidden), f"that bandwidth hides (almost) everything: at "
         f"{u:.0%} utilization each step may also stall T(1 − u)/u = {stall:.3f} s"),
    ], other=f"got {fmt(predicted_gbps)} Gbit/s, expected about {ref:.1f}")


@exercise("Decoupled DiLoCo bandwidth", todo="the slowest link, in Gbit/s, at which a "
                                              "Decoupled DiLoCo learner still reaches the target "
                                              "compute utilization u")
def check_decoupled_bandwidth(predicted_gbps, *, n_params: float = 10e9,
                              step_time_s: float = 1.6, target_utilization: float = 0.9) -> Result:
    """`predicted_gbps`: Decoupled DiLoCo's need (defaults: P = 24 fragments, int4, τ = 2, and
    the syncer's reply in 4 bits too, so that the upload is what the link must carry)."""
    algo = DecoupledDiLoCo(down_bits=4)
    n, t, u, p, b = n_params, step_time_s, target_utilization, algo.fragments, algo.bits
    ref = bw.required_bandwidth(algo, n_params=n, step_time_s=t, target_utilization=u)
    rate = n * b / p / t / 1e9  # Gbit/s to keep up exactly
    return judge(number(predicted_gbps), ref, rtol=BW_RTOL,
                 success=f"{ref:.3f} Gbit/s: the link only has to keep up on average",
                 mistakes=[
        ("ring", u * rate * 1.75, "no ring here: each learner uploads its fragment to the "
         "syncer over its own link"),
        ("bf16", u * rate * 16 / b, f"the fragments travel in {b} bits, not 16"),
        ("whole_model", u * rate * p, f"one fragment (1/{p} of the model) leaves per step, not "
         "the whole model"),
        ("no_u", rate, f"the link may idle {1 - u:.0%} of the time: multiply by u"),
        ("u_divided", rate / u, "multiply by u: at utilization u a step lasts T/u, so there is "
         "more time per fragment, not less"),
    ], other=f"got {fmt(predicted_gbps)} Gbit/s, expected about {ref:.3f}")


@exercise("cluster MTBF", todo="the mean time between failures of the whole cluster, in "
                                "seconds")
def check_cluster_mtbf(predicted_s, *, chips: float = 1.2e6, mtbi_years: float = 1.0) -> Result:
    """`predicted_s`: seconds between failures of the whole cluster."""
    ref = mtbi_years * SECONDS_PER_YEAR / chips
    return judge(number(predicted_s), ref, rtol=2e-3,
                 success=f"one failure every {ref:.1f} s", mistakes=[
        ("hours", ref / 3600, "that is in hours: the answer is wanted in seconds"),
        ("minutes", ref / 60, "that is in minutes: the answer is wanted in seconds"),
        ("days", ref / 86400, "that is in days: the answer is wanted in seconds"),
        ("per_chip", mtbi_years * SECONDS_PER_YEAR, "that is ONE chip's mean time between "
         "interruptions: N chips fail N times as often"),
        ("times_chips", ref * chips**2, "multiply the failure RATE by N, i.e. divide the time "
         "between failures by N"),
    ], other=f"got {fmt(predicted_s)} s, expected {ref:.1f} s")


@exercise("Young's checkpoint interval", todo="the checkpoint interval by Young's rule for "
                                               "this checkpoint cost and MTBF, in seconds")
def check_young_interval(predicted_s, *, checkpoint_s: float, mtbf_s: float) -> Result:
    """`predicted_s`: Young's checkpoint interval for a checkpoint costing δ = `checkpoint_s`."""
    d, m = checkpoint_s, mtbf_s
    ref = closed.young_interval(d, m)
    return judge(number(predicted_s), ref, rtol=1e-6, success=f"{ref:.2f} s", mistakes=[
        ("no_two", math.sqrt(d * m), "Young's rule has a factor 2 under the root: √(2δ·MTBF)"),
        ("no_sqrt", 2 * d * m, "take the square root: the interval balances checkpoint cost "
         "(∝ 1/T_ckpt) against lost work (∝ T_ckpt), which meet at √(2δ·MTBF)"),
        ("chip_mtbf", math.sqrt(2 * d * SECONDS_PER_YEAR), "use the CLUSTER's MTBF (a failure "
         "anywhere stops the job), not one chip's"),
        ("daly", closed.daly_interval(d, m), "that is Daly's refinement: Young's rule is "
         "√(2δ·MTBF) alone"),
    ], other=f"got {fmt(predicted_s)} s, expected √(2δ·MTBF) = {ref:.2f} s")


@exercise("Daly's checkpoint interval", todo="the checkpoint interval by Daly's refinement "
                                              "for this checkpoint cost and MTBF, in seconds")
def check_daly_interval(predicted_s, *, checkpoint_s: float, mtbf_s: float) -> Result:
    """`predicted_s`: Daly's higher-order checkpoint interval (δ < 2M)."""
    d, m = checkpoint_s, mtbf_s
    ref, young = closed.daly_interval(d, m), closed.young_interval(d, m)
    factor = 1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)
    return judge(number(predicted_s), ref, rtol=1e-6, success=f"{ref:.2f} s", mistakes=[
        ("young", young, "that is Young's rule: Daly multiplies it by (1 + √(δ/2M)/3 + δ/(18M)) "
         "and subtracts δ"),
        ("no_minus", young * factor, "subtract δ: Daly's interval counts compute time only"),
        ("no_factor", young - d, "you subtracted δ but left out Daly's correction factor "
         "(1 + √(δ/2M)/3 + δ/(18M))"),
    ], other=f"got {fmt(predicted_s)} s, expected {ref:.2f} s")


@exercise("domain goodput", todo="return the goodput of one failure domain, as a fraction, "
                                  "for the failure rate, work, commit and recovery times given")
def check_domain_goodput(fn) -> Result:
    """`fn(rate, work_s, commit_s, absorbed_s, exposed_s)` -> one failure domain's goodput."""
    cases = [(1 / 26.3, 6.3, 1.0, 35.0, 5.0), (1 / 210.0, 24.0, 0.0, 10.0, 5.0),
             (1 / 1000.0, 60.0, 2.0, 0.0, 30.0)]

    def each(f):
        return tuple(float(f(*c)) for c in cases)

    def without_recovery(lam, work, commit, absorbed, exposed):
        return work / (math.expm1(lam * (work + commit)) / lam)

    def plain_recovery(lam, work, commit, absorbed, exposed):
        return work / (math.expm1(lam * (work + commit)) * (1 / lam + absorbed + exposed))

    def work_only(lam, work, commit, absorbed, exposed):
        return closed.domain_goodput(lam, work, 0.0, absorbed, exposed)

    got = tuple(number(attempt(fn, *c)) for c in cases)
    return judge(got, each(closed.domain_goodput), rtol=1e-6,
                 success="the renewal-reward goodput, for every case", mistakes=[
        ("no_recovery", each(without_recovery), "each failure also costs a recovery W: "
         "G = T_work / ((e^(λT) − 1)·(1/λ + W))"),
        ("plain_recovery", each(plain_recovery), "a failure during the exposed part R_e "
         "restarts the recovery: W = (R_a + (1 − e^(−λR_e))/λ)·e^(λR_e), not R_a + R_e"),
        ("no_commit", each(work_only), "a segment lasts T = T_work + δ: the checkpoint (commit) "
         "can be hit by a failure too"),
    ], other="compare your formula with G = T_work / ((e^(λ(T_work+δ)) − 1)·(1/λ + W))")
