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
        ("no_ring", gbps(n * grad_bits, hidden + stall), "a ring all-reduce moves more than "
         "the payload through each link: reread notebook 05's ring"),
        ("ring_2", gbps(2 * n * grad_bits, hidden + stall), f"the ring factor depends on R: "
         f"for R = {r} it is below 2"),
        ("fp32", gbps(n * 32 * ring, hidden + stall), f"gradients travel in bf16: {grad_bits} "
         "bits each, not 32"),
        ("bytes", gbps(on_wire / 8, hidden + stall), "that is in GB/s: links are rated in "
         "Gbit/s"),
        ("no_hiding", gbps(on_wire, stall), "part of the transfer hides behind the backward "
         "pass: count how much of it"),
        ("all_hidden", gbps(on_wire, 2 * t / 3 + stall), "the last bucket is released when the "
         "backward pass ends, so it cannot hide behind it"),
        ("hide_all", gbps(on_wire, 2 * t / 3), f"that bandwidth hides the whole transfer "
         f"behind the backward pass; at {u:.0%} utilization each step may also stall a little, "
         "and the last bucket never hides"),
        ("no_stall", gbps(on_wire, hidden), f"that bandwidth hides (almost) everything: at "
         f"{u:.0%} utilization each step may also stall a little"),
    ], other=f"got {fmt(predicted_gbps)} Gbit/s, neither the speed DDP needs nor a classic "
             "mistake: recount the bits per step, then the time they have")


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
        ("no_u", rate, f"at {u:.0%} utilization a step lasts longer than T: the link has more "
         "time per fragment"),
        ("u_divided", rate / u, "at utilization u a step lasts longer, so there is more time "
         "per fragment, not less"),
    ], other=f"got {fmt(predicted_gbps)} Gbit/s, neither the speed a learner needs nor a "
             "classic mistake: recount the bits per step, then the time they have")


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
        ("times_chips", ref * chips**2, "N chips fail more often than one chip, not less"),
    ], other=f"got {fmt(predicted_s)} s: neither the cluster's MTBF nor a classic mistake; "
             "how often does one chip fail, and how often do N?")


@exercise("Young's checkpoint interval", todo="the checkpoint interval by Young's rule for "
                                               "this checkpoint cost and MTBF, in seconds")
def check_young_interval(predicted_s, *, checkpoint_s: float, mtbf_s: float) -> Result:
    """`predicted_s`: Young's checkpoint interval for a checkpoint costing δ = `checkpoint_s`."""
    d, m = checkpoint_s, mtbf_s
    ref = closed.young_interval(d, m)
    return judge(number(predicted_s), ref, rtol=1e-6, success=f"{ref:.2f} s", mistakes=[
        ("no_two", math.sqrt(d * m), "a factor under the root is missing: reread Young's rule"),
        ("no_sqrt", 2 * d * m, "the root is missing: the interval balances checkpoint cost "
         "against lost work, which meet at a square root"),
        ("chip_mtbf", math.sqrt(2 * d * SECONDS_PER_YEAR), "use the CLUSTER's MTBF (a failure "
         "anywhere stops the job), not one chip's"),
        ("daly", closed.daly_interval(d, m), "that is Daly's refinement: Young's rule is the "
         "simpler one, without the correction"),
    ], other=f"got {fmt(predicted_s)} s: neither Young's interval nor a classic mistake; "
             "reread the rule, then check its units")


@exercise("Daly's checkpoint interval", todo="the checkpoint interval by Daly's refinement "
                                              "for this checkpoint cost and MTBF, in seconds")
def check_daly_interval(predicted_s, *, checkpoint_s: float, mtbf_s: float) -> Result:
    """`predicted_s`: Daly's higher-order checkpoint interval (δ < 2M)."""
    d, m = checkpoint_s, mtbf_s
    ref, young = closed.daly_interval(d, m), closed.young_interval(d, m)
    factor = 1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)
    return judge(number(predicted_s), ref, rtol=1e-6, success=f"{ref:.2f} s", mistakes=[
        ("young", young, "that is Young's rule: Daly's refinement corrects it"),
        ("no_minus", young * factor, "Daly's interval counts compute time only: the checkpoint "
         "itself is not part of it"),
        ("no_factor", young - d, "you left out Daly's correction factor"),
    ], other=f"got {fmt(predicted_s)} s: neither Daly's interval nor a classic mistake; "
             "compare your refinement with the formula one term at a time")


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
         "where does it enter the expected time?"),
        ("plain_recovery", each(plain_recovery), "a failure during the exposed part of the "
         "recovery restarts it: W is more than the two recovery times added up"),
        ("no_commit", each(work_only), "the commit is part of the segment: a failure can hit "
         "it too"),
    ], other="your goodput is neither the renewal-reward one nor a classic mistake: compare "
             "your terms with the exercise's, one at a time")
