"""Notebook 04's experiments: Decoupled DiLoCo against lock-step DiLoCo on the simulated clock.

Every run consumes the same tokens: M × `steps` learner-steps (the lock-step runs exactly
`steps` rounds of M workers; Decoupled DiLoCo until its learners together have done as many).
With no cluster given, each learner takes one second per step and the link is free.

- `slow`: learner 7 takes two seconds per step. DiLoCo waits for it at every sync; Decoupled
  DiLoCo's other learners run on (they do more of the steps).
- `chaos`: learners fail at a high rate (each one every `MTBF` seconds on average, and is down
  `DOWN` seconds). DiLoCo stops and redoes the round (like data-parallel training), elastic
  DiLoCo drops the failed worker, Decoupled DiLoCo's syncer merges whoever is there.
- `ablations`: the syncer's pieces, one at a time from the reference Decoupled DiLoCo: RDA vs
  the plain mean at M = 8 and M = 16 (global batch fixed); 16-, 4- and 2-bit deltas, and a
  4-bit reply; the quorum K and the grace window, on a cluster whose step times jitter ±30%.

The reference Decoupled DiLoCo (`reference`): H as DiLoCo's, P = 4 balanced fragments, τ = 2,
4-bit deltas, K = 1, grace safety 0.5, RDA (docs/algorithms.md §4, with the paper's τ, K and bits;
P is ours: the model has 13–22 tensors, not the paper's hundreds).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ..clock import Cluster, FailureRate
from ..config import DecoupledDiLoCo, DiLoCo
from .common import H_REF, QUICK_STEPS, base_config, describe, matching_configs

GROUPS = ("slow", "chaos", "ablations")
SLOW = Cluster(step_time_s=(1.0,) * 7 + (2.0,))
JITTER = Cluster(jitter=0.3, seed=0)
# Per learner, in steps of one second: a failure every MTBF·H/50 s, down DOWN·H/50 s, so that a
# lock-step round of H steps survives with probability exp(−H·M/MTBF) ≈ 0.6 in both modes.
MTBF, DOWN = 800.0, 40.0

# The Decoupled DiLoCo paper's ablations (docs/algorithms.md §7, second-hand; benchmark average
# scores).
PUBLISHED = {
    ("merge", 8): (55.4, 54.1),  # RDA, plain mean at M = 8
    ("merge", 16): (54.5, 52.7),  # at M = 16
    "bits": {16: 55.4, 4: 55.3, 2: 42.6},  # bf16, int4, 2-bit outer gradients
}


def reference(quick: bool, **overrides) -> DecoupledDiLoCo:
    """The reference Decoupled DiLoCo of every group (module docstring)."""
    base = dict(inner_steps=H_REF[quick], fragments=4, overlap=2, bits=4, quorum=1,
                grace_safety=0.5, merge="rda")
    return DecoupledDiLoCo(**{**base, **overrides})


def chaos_cluster(quick: bool) -> Cluster:
    scale = H_REF[quick] / H_REF[False]
    return Cluster(failures=FailureRate(mtbf_s=MTBF * scale, down_s=DOWN * scale), seed=0)


def groups(quick: bool) -> dict[str, dict]:
    """Group name -> {label: RunConfig} (module docstring)."""
    h = H_REF[quick]
    base = base_config(quick)
    diloco, dec = DiLoCo(inner_steps=h), reference(quick)
    run = lambda algo, **kw: dataclasses.replace(base, algorithm=algo, **kw)  # noqa: E731
    chaos = chaos_cluster(quick)
    slow = {"DiLoCo": run(diloco, cluster=SLOW), "Decoupled DiLoCo": run(dec, cluster=SLOW)}
    chaotic = {"DiLoCo": run(diloco, cluster=chaos),
               "elastic DiLoCo": run(DiLoCo(inner_steps=h, elastic=True), cluster=chaos),
               "Decoupled DiLoCo": run(dec, cluster=chaos)}
    ablations = {"reference (RDA, M=8, 4-bit)": run(dec)}
    ablations["mean, M=8"] = run(reference(quick, merge="mean"))
    sixteen = dict(workers=16, batch_size=base.global_batch // 16)
    ablations["RDA, M=16"] = run(dec, **sixteen)
    ablations["mean, M=16"] = run(reference(quick, merge="mean"), **sixteen)
    for bits in (16, 2):
        ablations[f"{bits}-bit"] = run(reference(quick, bits=bits))
    ablations["4-bit, 4-bit reply"] = run(reference(quick, down_bits=4))
    ablations["K=1, jitter"] = run(dec, cluster=JITTER)
    ablations["K=1, no grace, jitter"] = run(reference(quick, grace_safety=0.0), cluster=JITTER)
    ablations["K=4, jitter"] = run(reference(quick, quorum=4), cluster=JITTER)
    ablations["K=8, jitter"] = run(reference(quick, quorum=8), cluster=JITTER)
    return {"slow": slow, "chaos": chaotic, "ablations": ablations}


def figures(group: str, histories: dict[str, pd.DataFrame]) -> dict[str, object]:
    from ..plots import decoupled as dp

    if group == "slow":
        return {"decoupled_slow": dp.loss_vs_time(
            histories, "One learner twice as slow: loss against simulated time",
            target=target_loss(histories))}
    if group == "chaos":
        return {"decoupled_chaos": dp.loss_vs_time(
                    histories, "Learners failing often: loss against simulated time"),
                "decoupled_chaos_goodput": dp.goodput_bars(chaos_table(histories))}
    return {"decoupled_ablations": dp.ablations(ablation_table(histories))}


def rows(group: str, histories: dict[str, pd.DataFrame]) -> list[dict]:
    """Final accuracy, loss, time, bytes and goodput per run, plus each group's comparison."""
    configs = _configs(group, histories)
    out = []

    def add(label, metric, value, published=None, note=""):
        out.append({"experiment": f"decoupled {group}", "method": label, "metric": metric,
                    "value": float(value), "published": published,
                    "config": (describe(configs[label]) if label in configs else "") + note})

    for label, h in histories.items():
        f = h.iloc[-1]
        add(label, "final val accuracy", f.val_accuracy)
        add(label, "final val loss", f.val_loss)
        add(label, "simulated time (s)", f.sim_time_s)
        add(label, "goodput (from the run)", f.goodput)
        add(label, "total bytes sent", f.comm_bytes)
        add(label, "peak Gbit/s up", f.peak_gbps)
    if group == "slow":
        target = target_loss(histories)
        for label, h in histories.items():
            add(label, f"time to val loss {target:.3f} (s)", time_to(h, target))
    elif group == "chaos":
        for r in chaos_table(histories).itertuples():
            add(r.method, "goodput lost to the overlap (by design)", r.overlap)
            add(r.method, "goodput, simulator at the same rate", r.simulator)
    else:
        for r in ablation_table(histories).itertuples():
            if not math.isnan(r.published_delta):
                add(r.method, "accuracy vs reference (points)", r.delta, r.published_delta,
                    "; published: benchmark average points")
    return out


# --------------------------------------------------------------------------------------------
# The analyses behind the figures and rows
# --------------------------------------------------------------------------------------------


def time_to(history: pd.DataFrame, target: float) -> float:
    """The simulated time at which held-out loss first reaches `target` (linear between
    evaluations), or NaN if it never does."""
    t, loss = history.sim_time_s.to_numpy(), history.val_loss.to_numpy()
    below = np.flatnonzero(loss <= target)
    if below.size == 0:
        return math.nan
    i = below[0]
    if i == 0:
        return float(t[0])
    frac = (loss[i - 1] - target) / (loss[i - 1] - loss[i])
    return float(t[i - 1] + frac * (t[i] - t[i - 1]))


def target_loss(histories: dict[str, pd.DataFrame]) -> float:
    """The target of the slow-learner race: the worst final held-out loss of the runs (so that
    every run reaches it)."""
    return float(max(h.val_loss.iloc[-1] for h in histories.values()))


def simulator_goodput(rate: FailureRate, learners: int, sync_steps: int,
                      step_s: float = 1.0) -> dict[str, float]:
    """Notebook 06's closed forms at the training run's failure rate, one chip per learner:
    dp ↔ DiLoCo (stop, wait `down_s`, redo since the last sync every `sync_steps`), elastic_dp ↔
    elastic DiLoCo (one learner missing `down_s`), decoupled ↔ Decoupled DiLoCo."""
    from ..systems.goodput import SECONDS_PER_YEAR, ChaosConfig, expected_goodput

    tiny = 1e-9  # the simulator's costs that the training clock does not have
    chaos = ChaosConfig(chips=learners, mtbi_chip_years=rate.mtbf_s / SECONDS_PER_YEAR,
                        detect_s=tiny, reschedule_s=rate.down_s, reload_s=tiny, checkpoint_s=tiny,
                        checkpoint_interval_s=sync_steps * step_s, step_s=step_s,
                        reconfigure_s=tiny, replica_chips=1, replacement_s=rate.down_s,
                        learner_reschedule_s=rate.down_s, rejoin_s=tiny, sync_steps=sync_steps)
    return {scheme: expected_goodput(scheme, chaos, learners=learners)
            for scheme in ("dp", "elastic_dp", "decoupled")}


CHAOS_SCHEMES = {"DiLoCo": "dp", "elastic DiLoCo": "elastic_dp", "Decoupled DiLoCo": "decoupled"}


def chaos_table(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Goodput measured from each chaos run beside the simulator's closed form, and the failures
    the run met beside the expected number (one draw: a few failures more or less move it).
    `overlap`: the share of the cluster's steps lost to the overlap by design (the steps between
    a learner's merged answer and applying the result, which the arrival overwrites at α = 0);
    the simulator models failures only, so `run + overlap` is what compares with it."""
    quick = all(h.step.iloc[-1] == QUICK_STEPS for h in histories.values())
    cluster, h_ref = chaos_cluster(quick), H_REF[quick]
    sim = simulator_goodput(cluster.failures, 8, h_ref)
    rate = cluster.failures

    def overlap(f):  # overlap-lost steps over the offered steps (= useful / goodput)
        return f.overlap_lost_steps * f.goodput / f.useful_steps if f.useful_steps else 0.0

    return pd.DataFrame([{"method": label, "run": h.goodput.iloc[-1],
                          "overlap": overlap(h.iloc[-1]),
                          "simulator": sim[CHAOS_SCHEMES[label]], "scheme": CHAOS_SCHEMES[label],
                          "failures": int(h.failures.iloc[-1]),
                          "expected failures": 8 * h.sim_time_s.iloc[-1] / rate.mtbf_s}
                         for label, h in histories.items()])


def ablation_table(histories: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Final held-out accuracy of every ablation, its change from its baseline (the reference,
    or at M = 16 the RDA run), the published change where there is one, and its goodput."""
    acc = {k: h.val_accuracy.iloc[-1] for k, h in histories.items()}
    ref = next(iter(acc))
    rda16, m16 = PUBLISHED[("merge", 16)]
    rda8, m8 = PUBLISHED[("merge", 8)]
    b = PUBLISHED["bits"]
    published = {"mean, M=8": m8 - rda8, "mean, M=16": m16 - rda16, "16-bit": b[16] - b[4],
                 "2-bit": b[2] - b[4]}
    rows = []
    for label, a in acc.items():
        base = acc.get("RDA, M=16", acc[ref]) if label == "mean, M=16" else acc[ref]
        kind = ("merge" if "M=" in label else "quorum and grace" if "jitter" in label
                else "bits")
        rows.append({"ablation": kind, "method": label, "val_accuracy": a,
                     "delta": 100 * (a - base), "published_delta": published.get(label, math.nan),
                     "goodput": histories[label].goodput.iloc[-1]})
    return pd.DataFrame(rows)


def _configs(group: str, histories: dict[str, pd.DataFrame]) -> dict:
    return matching_configs(groups, group, histories)
