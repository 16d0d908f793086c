"""The measuring of `actors.versus`: each run on the testbed, beside the simulated clock's, as a
run of `versus_table` (a dict: method, how, measured and simulated [step, val_loss, time_s]).

- `calibrate`: on loopback, the lock-step compute seconds per step and gloo's fixed cost per
  ring hop, as the `links` job measures them (`distributed.measure`); the same launch runs the
  DDP rows once at full length, for their loss curves.
- `lockstep_runs`: every repeat of every lock-step method at every link speed in one launch on
  a `Testbed` of M hosts (real gloo collectives through the throttled links, their rate set
  before each run), after a warm-up run of each (a process keeps the compiled programs of a
  config's shapes and schedule, so the measured runs compile nothing); `window_config` for a
  DDP run that would last too long.
- `decoupled_runs`: Decoupled DiLoCo on the actor runtime, on a `Testbed` of M + 1 hosts
  (one Ray cluster for all of its runs, the link rate set before each).
- `wire_rows`, `control`: its bytes on the wire beside the booked ones and the control traffic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..clock import Link, exchange_cost
from ..config import DDP, DiLoCo, RunConfig

TCP = "reno"  # the testbed's congestion control (`Testbed`'s `tcp`: BBR ran the links slower)
# each host link shared fairly among its peers (`Testbed`'s `fair`): with one FIFO per link a
# host's ACKs to one peer waited behind its data to another (DiLoCo's fp32 syncs at 1 Mbit/s:
# 1.12–1.15× their clock in a probe, 1.06–1.09× on fair links; docs/systems.md)
FAIR = True
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


def calibrate(learners: int, probe_steps: int, full: dict[str, RunConfig],
              pace_s: float = 0.0) -> dict:
    """On loopback (M processes of one device), every process paced about as the table's will
    be (`pace_s` of sleep a step, `train`'s): `t_step`, the compute seconds of a lock-step step
    beside that sleep (a DiLoCo run with H = a quarter of its steps, its seconds per step from
    its first sync to its last, less `pace_s`: every process enters that window together);
    `hop_s`, gloo's fixed cost per ring hop (a DDP run's seconds per step over the same window,
    less the DiLoCo run's, over its 2(M − 1) hops); `curves`: the history of each of `full`'s
    runs (the full loss curves of the runs `lockstep_runs` windows). Paced, because a process
    that sleeps between its blocks computes more slowly than one that never does (its caches
    and XLA's threads go cold, the processes' compute lands on the cores unevenly): measured
    unpaced over one sync's window, t₀ came out 0.041 s, and the runs paced with it took about
    0.12 s a step against the 0.1 s intended."""
    from ..distributed.launch import launch

    def probe(algo):
        return RunConfig(algorithm=algo, workers=learners, steps=probe_steps,
                         eval_every=probe_steps // 4, eval_batches=1)

    names, H = list(full), probe_steps // 4
    diloco, ddp, *rest = launch(
        [probe(DiLoCo(inner_steps=H)), probe(DDP())] + list(full.values()),
        processes=learners, devices_per_process=1, echo=False, timeout_s=1800, pace_s=pace_s)
    diloco_s = window_rate(diloco.history, "train_time_s", H)
    hops = exchange_cost(learners, gather=False)[1]
    ddp_s = window_rate(ddp.history, "train_time_s", H)
    return {"t_step": max(0.0, diloco_s - pace_s),
            "hop_s": max(0.0, ddp_s - diloco_s) / max(hops, 1),
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


def lockstep_runs(table: dict[float, dict[str, RunConfig]], repeats: int, curves: dict,
                  windows: dict[float, dict[str, tuple[int, int]]], pace_s: float = 0.0
                  ) -> list[dict]:
    """Every repeat of every lock-step method at every link speed of `table` ({Gbit/s: {name:
    config}}, each config's Cluster with that link), in one launch on a `Testbed` of M hosts
    (real gloo collectives through the throttled links): each run's link rate is set on the
    testbed before it (`launch`'s `set_links`), the speeds in turn, at each the repeats in turn
    (r = 0: every method, r = 1: every method, ...). First one warm-up run of each method at the
    first speed, measured end to end, left out (the programs of a run's shapes and schedule are
    compiled once per process, `algorithms`' caches, and do not depend on the link: the
    measured runs then compile nothing; a windowed run compiles in its lead, before its
    window). A method in `windows[gbit]` ({name: (lead, window)}) runs cut there
    (`window_config`): its seconds per step over the window times its full loss curve
    (`curves`, from `calibrate`). Every run carries the hosts' bytes on the wire over the
    launch ÷ their booked bytes times the collectives' factors (`lockstep_wire_over_model`).
    `pace_s`: seconds of compute added to every step of every process (`train`'s `pace_s`: the
    equal compute of the module `versus`)."""
    from ..distributed.launch import launch
    from ..distributed.testbed import Testbed

    speeds = list(table)
    end_to_end = {n for g in speeds for n in table[g] if n not in windows.get(g, {})}
    jobs = [(-1, speeds[0], n, c) for n, c in table[speeds[0]].items() if n in end_to_end]
    for gbit in speeds:
        cut = windows.get(gbit, {})
        for r in range(repeats):
            for name, c in table[gbit].items():
                jobs.append((r, gbit, name, window_config(c, *cut[name]) if name in cut else c))
    M = jobs[0][3].workers
    with Testbed(M, Link(gbit_per_s=speeds[0]), quiet=True, tcp=TCP, fair=FAIR) as bed:
        before = bed.counters()
        results = launch([c for *_, c in jobs], processes=M, devices_per_process=1,
                         testbed=bed, echo=False, timeout_s=4 * 3600, pace_s=pace_s,
                         set_links=True)
        sent = bed.sent_since(before)
    model = sum(float(res.final.comm_bytes) / M
                * exchange_cost(M, gather=not isinstance(c.algorithm, DDP))[0]
                for (*_, c), res in zip(jobs, results, strict=True))
    wire = float(np.mean([s["tx_bytes"] for s in sent])) / model if sent else np.nan
    runs = []
    for (r, gbit, name, _), res in zip(jobs, results, strict=True):
        if r < 0:
            continue  # a warm-up
        h = res.history
        run = {"gbit_per_s": gbit, "method": name, "repeat": r,
               "lockstep_wire_over_model": wire,
               "booked_per_host": float(h.comm_bytes.iloc[-1]) / M,
               "eval_s": float(h.wall_time_s.iloc[-1] - h.train_time_s.iloc[-1])}
        if name in windows.get(gbit, {}):
            lead, window = windows[gbit][name]
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


def decoupled_runs(entries: list[dict], probe_after: int | None = None,
                   progress: bool = False) -> list[dict]:
    """Decoupled DiLoCo runs on the actor runtime, all on one `Testbed` of M + 1 hosts (the
    syncer on host 0) and one Ray cluster on it, in turn, each at its config's link rate
    (`hosts.trains_on_testbed`). `entries`: dicts of "config", "sim" (`simulated` of it),
    `key` and its value, "repeat": each gives a run of `versus_table` with the simulated curve
    beside it, its last row's time moved to the end of the flush where the meter saw it
    (`flush_end_s`), and its killed learners' replacement times (`kill_times`).
    `probe_after`: after that many entries, Ray's bytes per call are measured at the rate then
    set (`hosts.call_bytes`), and every run at that rate gets its control traffic
    (`wire_rows`)."""
    from ..distributed.testbed import Testbed
    from .hosts import trains_on_testbed

    first = entries[0]["config"]
    jobs = [e["config"] for e in entries]
    at = None
    if probe_after is not None:
        e = entries[probe_after - 1]
        at = e["config"].cluster.link.gbit_per_s
        jobs.insert(probe_after, dict(payload=_payload_size(e["sim"][1])))
    with Testbed(first.workers + 1, Link(gbit_per_s=first.cluster.link.gbit_per_s),
                 quiet=True, tcp=TCP, fair=FAIR) as bed:
        got = trains_on_testbed(jobs, bed, progress=progress)
    calls = got.pop(probe_after) if probe_after is not None else None
    runs = []
    for e, dec in zip(entries, got, strict=True):
        config = e["config"]
        measured = curve(dec.history, "sim_time_s")
        end = flush_end_s(dec)
        flush = max(0.0, end - measured.time_s.iloc[-1]) if np.isfinite(end) else np.nan
        if np.isfinite(flush):
            measured.loc[measured.index[-1], "time_s"] += flush
        per_call = calls if config.cluster.link.gbit_per_s == at else None
        runs.append({e["key"]: e["value"], "method": "decoupled", "repeat": e["repeat"],
                     "how": "end to end", "measured": measured, "simulated": e["sim"][0],
                     "flush_s": flush, "outer_steps": float(dec.final.outer_steps),
                     "goodput": float(dec.final.goodput),
                     "booked_per_host": float(dec.final.comm_bytes) / config.workers,
                     **kill_times(dec), **wire_rows(dec, per_call)})
    return runs


def kill_times(result) -> dict:
    """A run's killed learners' replacements (`measure.replacement_times`): the longest time
    from a kill to its replacement running (`max_ready_s`) and from the window's end to its
    first step (`max_first_step_s`); nothing without a kill."""
    from .measure import replacement_times

    kills = (getattr(result, "runtime", None) or {}).get("kills") or []
    return {k: v for k, v in replacement_times(kills).items()
            if k.startswith("max_") and np.isfinite(v)}


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
    the run's answers and replies over M; the syncer's: all of them, less the peers' inner
    states that went from host to host, `direct_up`/`direct_down`) and the control traffic
    (`control`), when `per_call` (`hosts.call_bytes`, at the run's link speed) is given."""
    if result.wire is None:
        return {}
    M = result.config.workers
    learners = result.wire[1:]
    booked = {"tx": float(result.final.comm_bytes) / M, "rx": float(result.final.down_bytes) / M}
    model = [control(w, per_call, booked) for w in learners] if per_call is not None else None
    out = {}
    # peers' inner states for returning learners go from host to host, not through the syncer's
    direct = {way: float(sum(w.get(f"direct_{way}", 0) for w in learners))
              for way in ("up", "down")}
    for way, key, back in (("up", "tx", "rx"), ("down", "rx", "tx")):
        out[f"{way}_wire"] = float(np.mean([w[f"{key}_bytes"] for w in learners]))
        out[f"{way}_booked"] = booked[key]
        # the syncer's host sends what the learners receive, and receives what they send
        out[f"syncer_{way}_wire"] = float(result.wire[0][f"{key}_bytes"])
        out[f"syncer_{way}_booked"] = M * booked[back] - direct["down" if way == "up" else "up"]
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
