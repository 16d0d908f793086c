"""The measuring of `actors.versus`: each run on the testbed, beside the simulated clock's, as a
run of `versus_table` (a dict: method, how, measured and simulated [step, val_loss, time_s]).

- `calibrate`: on loopback, the lock-step compute seconds per step and gloo's fixed cost per
  ring hop, as the `links` job measures them (`distributed.measure`); the same launch runs the
  DDP rows once at full length, for their loss curves.
- `lockstep_runs`: every repeat of every lock-step method at one link speed in one launch on a
  `Testbed` of M hosts (real gloo collectives through the throttled links), after a warm-up run
  of each (a process keeps the compiled programs of a config's shapes and schedule, so the
  measured runs compile nothing); `window_config` for a DDP run that would last too long.
- `decoupled_run`: Decoupled DiLoCo on the actor runtime, on a `Testbed` of M + 1 hosts.
- `wire_rows`, `control`: its bytes on the wire beside the booked ones and the control traffic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..clock import Link, exchange_cost
from ..config import DDP, DiLoCo, RunConfig

START_IN_S = 0.5  # `train_actors`' default start_in_s: its clock starts that long after the meter


def curve(history: pd.DataFrame, column: str) -> pd.DataFrame:
    """[step, val_loss, time_s] of a history, its seconds from `column`."""
    return pd.DataFrame({"step": history.step.to_numpy(float),
                         "val_loss": history.val_loss.to_numpy(float),
                         "time_s": history[column].to_numpy(float)})


def paced(loss_curve: pd.DataFrame, s_per_step: float) -> pd.DataFrame:
    """A loss curve [step, val_loss] timed at `s_per_step` from step 0 (a lock-step DDP run's
    loss per step does not depend on the link, and its pace is the same at every step)."""
    out = loss_curve[["step", "val_loss"]].copy()
    out["time_s"] = out.step * s_per_step
    return out


def window_rate(history: pd.DataFrame, column: str, first_step: int) -> float:
    """Seconds per step of `column` from the history row at `first_step` to the last."""
    last = history.iloc[-1]
    first = history[history.step == first_step].iloc[0]
    return float((last[column] - first[column]) / (last.step - first.step))


def calibrate(learners: int, probe_steps: int, full: dict[str, RunConfig]) -> dict:
    """On loopback (M processes of one device): `t_step`, the compute seconds of a lock-step
    step (a DiLoCo run with H = half its steps, measured from its first sync to its second, as
    the `links` job does: every process enters that window together); `hop_s`, gloo's fixed
    cost per ring hop (a DDP run's seconds per step over the same window, less `t_step`, over
    its 2(M − 1) hops); `curves`: the history of each of `full`'s runs (the full loss curves
    of the runs `lockstep_runs` windows)."""
    from ..distributed.launch import launch

    def probe(algo):
        return RunConfig(algorithm=algo, workers=learners, steps=probe_steps,
                         eval_every=probe_steps // 4, eval_batches=1)

    names = list(full)
    diloco, ddp, *rest = launch(
        [probe(DiLoCo(inner_steps=probe_steps // 2)), probe(DDP())] + list(full.values()),
        processes=learners, devices_per_process=1, echo=False, timeout_s=1800)
    t_step = window_rate(diloco.history, "train_time_s", probe_steps // 2)
    hops = exchange_cost(learners, gather=False)[1]
    ddp_s = window_rate(ddp.history, "train_time_s", probe_steps // 2)
    return {"t_step": t_step, "hop_s": max(0.0, ddp_s - t_step) / max(hops, 1),
            "curves": {n: r.history for n, r in zip(names, rest, strict=True)}}


def predicted_s(config: RunConfig, booked_per_step: float) -> float:
    """A lock-step run's seconds on the clock of its config, roughly: per step its compute, its
    collective's hops' latency and its bytes through the link, the collective's factor times
    `booked_per_step` (one worker's bytes per step); used to choose which runs to window."""
    link, algo = config.cluster.link, config.algorithm
    factor, hops = exchange_cost(config.workers, gather=not isinstance(algo, DDP))
    every = 1 if isinstance(algo, DDP) else algo.inner_steps
    comm = hops * link.latency_s / every + factor * booked_per_step * 8 / (link.gbit_per_s * 1e9)
    return config.steps * (config.cluster.step_time_s + comm)


def window_config(config: RunConfig, lead: int, window: int) -> RunConfig:
    """`config` cut to `lead` + `window` steps, evaluated every `lead` steps: its first block
    compiles (and the evaluator, if it has not), the window runs from the row at `lead` to the
    last. A DDP step all-reduces, so the processes enter the window together (the others wait
    for process 0's evaluation at the next step's all-reduce: at most one step's compute)."""
    return dataclasses.replace(config, steps=lead + window, eval_every=lead,
                               warmup_steps=min(config.warmup_steps, lead))


def lockstep_runs(gbit: float, configs: dict[str, RunConfig], repeats: int, curves: dict,
                  windows: dict[str, tuple[int, int]], key: str = "gbit_per_s",
                  pace_s: float = 0.0) -> list[dict]:
    """Every repeat of every config of `configs` (lock-step methods, each config's Cluster with
    the link of `gbit` Gbit/s) in one launch on a `Testbed` of M hosts, the repeats in turn
    (r = 0: every method, r = 1: every method, ...), after one warm-up run of each method
    measured end to end, left out (the programs of a run's shapes and schedule are compiled
    once per process, `algorithms`' caches: the measured runs then compile nothing; a windowed
    run compiles in its lead, before its window). A method in `windows` ({name: (lead,
    window)}) runs cut (`window_config`): its seconds per step over the window times its full
    loss curve (`curves`, from `calibrate`). Every run of the launch carries the hosts' bytes on
    the wire over the launch ÷ their booked bytes times the collectives' factors
    (`lockstep_wire_over_model`). `pace_s`: seconds of compute added to every step of every
    process (`train`'s `pace_s`: the equal compute of the module `versus`)."""
    from ..distributed.launch import launch
    from ..distributed.testbed import Testbed

    jobs = [(-1, name, c) for name, c in configs.items() if name not in windows]
    for r in range(repeats):
        for name, c in configs.items():
            jobs.append((r, name, window_config(c, *windows[name]) if name in windows else c))
    M = next(iter(configs.values())).workers
    with Testbed(M, Link(gbit_per_s=gbit), quiet=True) as bed:
        before = bed.counters()
        results = launch([c for _, _, c in jobs], processes=M, devices_per_process=1,
                         testbed=bed, echo=False, timeout_s=3600, pace_s=pace_s)
        sent = bed.sent_since(before)
    model = sum(float(res.final.comm_bytes) / M
                * exchange_cost(M, gather=not isinstance(c.algorithm, DDP))[0]
                for (_, _, c), res in zip(jobs, results, strict=True))
    wire = float(np.mean([s["tx_bytes"] for s in sent])) / model if sent else np.nan
    runs = []
    for (r, name, _), res in zip(jobs, results, strict=True):
        if r < 0:
            continue  # a warm-up
        h = res.history
        run = {key: gbit, "method": name, "repeat": r, "lockstep_wire_over_model": wire,
               "booked_per_host": float(h.comm_bytes.iloc[-1]) / M,
               "eval_s": float(h.wall_time_s.iloc[-1] - h.train_time_s.iloc[-1])}
        if name in windows:
            lead, window = windows[name]
            run.update(how=f"window of {window} steps",
                       measured=paced(curves[name], window_rate(h, "train_time_s", lead)),
                       simulated=paced(curves[name], window_rate(h, "sim_time_s", lead)),
                       booked_per_host=float(curves[name].comm_bytes.iloc[-1]) / M)
        else:
            run.update(how="end to end", measured=curve(h, "train_time_s"),
                       simulated=curve(h, "sim_time_s"), startup_s=startup_s(h))
        runs.append(run)
    return runs


def startup_s(history: pd.DataFrame) -> float:
    """What the first block of a run took beyond its steps at the pace of the rest (compilation,
    or loading compiled programs): the time of its first row less its steps at the seconds
    per step from there to the last row, `train_time_s`. A check that compilation is out."""
    h = history
    pace = (h.train_time_s.iloc[-1] - h.train_time_s.iloc[0]) / (h.step.iloc[-1] - h.step.iloc[0])
    return float(h.train_time_s.iloc[0] - h.step.iloc[0] * pace)


def flush_end_s(result) -> float:
    """When a run on the testbed's actors ended, its end-of-run flush included, on its own
    clock: the span of its hosts' meter (from just before the clock's start to after the
    flush) less the delay before the clock starts; NaN without a meter."""
    if result.wire is None:
        return float("nan")
    return float(result.wire[0]["s"]) - START_IN_S


def decoupled_run(config: RunConfig, simulated: pd.DataFrame, key: str, value, repeat: int,
                  calls: dict | None = None, measure_calls: bool = False,
                  progress: bool = False) -> dict:
    """One run of `config` (a DecoupledDiLoCo) on the actor runtime, on a `Testbed` of M + 1
    hosts at its Cluster's link rate (the syncer on host 0), as a run of `versus_table`; its
    last row's time moved to the end of the flush where the meter saw it (`flush_end_s`).
    `calls`: Ray's bytes per call at this speed (`hosts.call_bytes`), for the control traffic;
    `measure_calls`: measure them after the run, on the same testbed (they go in "calls")."""
    from ..distributed.testbed import Testbed
    from .hosts import call_bytes, train_on_testbed

    link = Link(gbit_per_s=config.cluster.link.gbit_per_s)
    with Testbed(config.workers + 1, link, quiet=True) as bed:
        dec = train_on_testbed(config, bed, progress=progress)
        if measure_calls and bed.emulated:
            calls = call_bytes(bed, payload=_payload_size(dec))
    measured = curve(dec.history, "sim_time_s")
    end = flush_end_s(dec)
    flush = max(0.0, end - measured.time_s.iloc[-1]) if np.isfinite(end) else np.nan
    if np.isfinite(flush):
        measured.loc[measured.index[-1], "time_s"] += flush
    out = {key: value, "method": "decoupled", "repeat": repeat, "how": "end to end",
           "measured": measured, "simulated": simulated, "flush_s": flush,
           "outer_steps": float(dec.final.outer_steps), "goodput": float(dec.final.goodput),
           "booked_per_host": float(dec.final.comm_bytes) / config.workers,
           **wire_rows(dec, calls)}
    if measure_calls:
        out["calls"] = calls
    return out


def simulated(config: RunConfig) -> tuple[pd.DataFrame, object]:
    """`train(config)` on the simulated clock: its [step, val_loss, time_s] and its result."""
    from ..training import train

    result = train(config, progress=False)
    return curve(result.history, "sim_time_s"), result


def _payload_size(result) -> int:
    """The mean booked bytes of one answer of a run (4-bit answers and replies alike)."""
    answers = sum(f["syncs"] for f in result.plan.fragments)
    return max(1, round(float(result.final.comm_bytes) / max(answers, 1)
                        / result.config.workers))


def wire_rows(result, per_call: dict | None) -> dict:
    """A run on the testbed: its learner hosts' mean bytes on the wire, up (what a host sent)
    and down (what it received), and the syncer's host's, beside the booked bytes (a learner's:
    the run's answers and replies over M; the syncer's: all of them) and the control traffic
    (`control`), when `per_call` (`hosts.call_bytes`, at the run's link speed) is given."""
    if result.wire is None:
        return {}
    M = result.config.workers
    learners = result.wire[1:]
    booked = {"tx": float(result.final.comm_bytes) / M, "rx": float(result.final.down_bytes) / M}
    model = [control(w, per_call, booked) for w in learners] if per_call is not None else None
    out = {}
    for way, key, back in (("up", "tx", "rx"), ("down", "rx", "tx")):
        out[f"{way}_wire"] = float(np.mean([w[f"{key}_bytes"] for w in learners]))
        out[f"{way}_booked"] = booked[key]
        # the syncer's host sends what the learners receive, and receives what they send
        out[f"syncer_{way}_wire"] = float(result.wire[0][f"{key}_bytes"])
        out[f"syncer_{way}_booked"] = M * booked[back]
        if model is not None:
            out[f"{way}_control"] = float(np.mean([c[key] for c in model]))
            out[f"syncer_{way}_control"] = float(sum(c[back] for c in model))
    return out


def control(host: dict, per_call: dict, booked: dict) -> dict:
    """One learner host's control traffic over a run, {"tx", "rx"}: what it put on its wire
    beyond its `booked` bytes ({"tx": its answers', "rx": its replies'}). Its Ray calls, counted
    each way by the syncer (`calls_up`, `calls_down`), at an empty call's bytes; each byte those
    calls carried (the booked ones plus what else their arguments pickle to: `unbooked_up`,
    `unbooked_down`) at what a payload byte adds (TCP's headers, its ACKs the other way); the
    nodes' idle traffic over the metered seconds (`s`)."""
    B = per_call["payload"]
    carried = {"up": booked["tx"] + host["unbooked_up"],
               "down": booked["rx"] + host["unbooked_down"]}
    out = {}
    for key in ("tx", "rx"):
        total = per_call[f"idle_{key}"] * host["s"]
        for kind in ("up", "down"):
            per_byte = (per_call[f"{kind}_payload"][key] - per_call[kind][key]) / B
            total += host[f"calls_{kind}"] * per_call[kind][key] + carried[kind] * per_byte
        out[key] = total - booked[key]
    return out
