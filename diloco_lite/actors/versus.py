"""Where the speed-up over slow links comes from, measured: every method on the testbed at four
link speeds, end to end, with repeats; then where the decoupling earns its keep (issue 37).

    python -m diloco_lite.actors.versus            # 4 learner hosts (+ the syncer's), ~45 min
    python -m diloco_lite.actors.versus --quick    # 2 learner hosts, 60 steps, 2 speeds

**The table** (`measure` → `versus_table.cells`): rows = methods, at 1000, 100, 10 and 1 Mbit/s
per host link (`distributed.testbed`: network namespaces behind `tc`-shaped links), M learner
hosts, the default model, the same tokens (M × `steps` sequences of steps):

- `ddp` (fp32 gradients), `ddp-bf16` (bf16 gradients, what the seeds' bandwidth model assumes);
- `diloco`: DiLoCo at H (fp32); `diloco-4bit`: Streaming DiLoCo with one fragment, τ = 0, 4 bits,
  α = 0 (DiLoCo at 4 bits); `streaming`: Streaming DiLoCo at H with Decoupled DiLoCo's fragments
  (4), τ (2), bits (4) and α (0);
- `decoupled`: Decoupled DiLoCo, the same, with K = 1, the grace window, 4-bit replies, on the
  actor runtime (`hosts.train_on_testbed`): its syncer on a fifth host of its own.

The lock-step rows run in one `distributed.launch` over a `Testbed` of M hosts (real gloo
collectives through the throttled links), every repeat of every method at every speed in turn.
**Equal compute per step**, t = `step_time_s` seconds (an emulated chip slower than this
machine's): `versus_runs.calibrate` measures the lock-step processes' compute per step on
loopback, t₀ (M processes sharing the machine's cores, each already sleeping about t/2 a step:
a process that sleeps computes more slowly than one that never does), as the `links` job does
(with gloo's fixed cost per ring hop, which the clock charges as the link's latency); every
lock-step process then adds t − t₀ of sleep per step (`train`'s `pace_s`), and Decoupled
DiLoCo's learners pad their steps to t (`Cluster.step_time_s`). Why not t = t₀: M learner
processes, the syncer and Ray's own processes cannot keep t₀ on the cores that M lock-step
processes fill (a quick run at t₀ left the actors' steps 1.7–1.9× slower than their clock, and
their loss worse). The hosts run TCP Reno (`versus_runs.TCP`), each host's link shared fairly
among its peers (`versus_runs.FAIR`, `Testbed`'s `fair`). Every row's config carries that
`Cluster` (t, the link's rate, the hop cost), so the simulated clock beside each cell is
`train` of the very same config: the lock-step run's own `sim_time_s` (its numbers equal a
one-process run's), Decoupled DiLoCo's `train(config)`.

**Each cell** is the time to the target loss, from the run's clock start to the interpolated
crossing of the target (`measure.time_to`), compilation and evaluations left out: the one launch
of every lock-step run (every speed in turn: `launch(set_links=True)` sets the testbed's rate
before each run) first runs every lock-step method once, unmeasured, so that the measured runs
reuse its compiled programs (`startup_s`, a run's first block beyond the pace of the rest,
checks it), and their `train_time_s` leaves process 0's evaluations out (the others may run
ahead by at most that long: `eval_s`); the actors' clock starts when every learner is ready, and
the end-of-run flush is inside (`versus_runs.flush_end_s`). Decoupled DiLoCo's runs (the
table's, then Ray's bytes per call at the slowest link, then the decoupling rows) run in turn on
one Ray cluster over the testbed (`hosts.trains_on_testbed`, the rate set before each run). The
target at each speed is the worst final held-out loss among every run there, measured or
simulated (`target_loss`); the simulated clock's seconds beside a cell are to that same loss
(`sim_s`: measured ÷ simulated compares like with like), its speed-ups to its own target, the
worst of its own runs' final losses (`sim_own_s`). A DDP run whose clock says it would last
longer than `max_run_s` (10 and 1 Mbit/s) is measured over a window of `window[1]` steps after
`window[0]` that compile and evaluate, all processes entering it together, and timed as its
seconds per step times its full loss curve (the column `how` says which). `repeats` runs per
cell (median, min and max); the speed-ups over DDP are of the medians, their ranges DDP's
extremes over the row's.
`decomposition`: the cut (DDP ÷ Streaming) times the decoupling (Streaming ÷ Decoupled) =
Decoupled's speed-up.

**The decoupling rows** (`decoupling`): at 10 Mbit/s, one learner twice as slow (`slow`), one
learner killed for the middle third of the run (`killed`: `Cluster.failures`, the third of
Decoupled DiLoCo's simulated run time). `launch` can neither pad one process's steps nor survive
a kill, so the lock-step methods run on the actor runtime in Decoupled DiLoCo's synchronous
limit (K = M, no grace, the mean merge, exact replies: `tests/test_identities.py` holds it equal
to DiLoCo and Streaming DiLoCo with equal learners). There the learners never wait: with one
slow learner the others step on while each sync waits for its answer, and a killed learner
holds every open sync (K = M) until it is back, while the others step on. Beside each: the
simulated clock's run of the very same config, and the lock-step method itself on the clock
(`lockstep_sim_s`; `elastic=True` where a learner is killed: it goes on without it).

Not in `make test` (root, iproute2, Ray; 45 minutes on 2 cores, measured); `make reproduce`'s
`versus` job runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import pandas as pd

from ..clock import Cluster, Link
from ..config import DDP, DecoupledDiLoCo, DiLoCo, RunConfig, StreamingDiLoCo
from .versus_runs import control, wire_rows  # noqa: F401 - the table's byte columns
from .versus_table import (  # noqa: F401
    cells,
    decomposition,
    decoupling_markdown,
    markdown,
    ratio,
    result_rows,
    speedups,
)

MBIT = 1e-3  # Gbit/s
AT = 10 * MBIT  # the decoupling rows' link


def settings(quick: bool) -> dict:
    """The measurement of `make reproduce` (job `versus`); quick: 2 learners, 60 steps, two
    speeds, one repeat, the killed-learner scenario only, no control-traffic probe."""
    if quick:
        return dict(learners=2, steps=60, inner_steps=12, step_time_s=0.1,
                    speeds=(100 * MBIT, 10 * MBIT),
                    repeats=1, probe_steps=48, window=(2, 6), max_run_s=15.0,
                    scenarios=("killed",), call_bytes=False)
    return dict(learners=4, steps=128, inner_steps=32, step_time_s=0.1,
                speeds=(1000 * MBIT, 100 * MBIT, 10 * MBIT, 1 * MBIT), repeats=3,
                probe_steps=120, window=(2, 20), max_run_s=40.0, scenarios=("slow", "killed"),
                call_bytes=True)


def methods(learners: int, steps: int, inner_steps: int,
            cluster: Cluster | None = None) -> dict[str, RunConfig]:
    """The table's rows (module docstring): name -> its config, every one with `cluster`."""
    H = inner_steps
    base = RunConfig(algorithm=DDP(), workers=learners, steps=steps,
                     eval_every=max(1, steps // 8), eval_batches=2, cluster=cluster)
    algos = {
        "ddp": DDP(),
        "ddp-bf16": DDP(bits=16),
        "diloco": DiLoCo(inner_steps=H),
        "diloco-4bit": StreamingDiLoCo(inner_steps=H, fragments=1, overlap=0, bits=4, mix=0.0),
        "streaming": StreamingDiLoCo(inner_steps=H, fragments=4, overlap=2, bits=4, mix=0.0),
        "decoupled": DecoupledDiLoCo(inner_steps=H, fragments=4, overlap=2, bits=4, down_bits=4,
                                     quorum=1, grace_safety=0.5),
    }
    return {name: dataclasses.replace(base, algorithm=a) for name, a in algos.items()}


def scenario_cluster(cluster: Cluster, learners: int, scenario: str, run_s: float) -> Cluster:
    """`cluster` with its last learner twice as slow ("slow") or killed for the middle third
    of `run_s` seconds ("killed")."""
    t = cluster.step_time_s
    if scenario == "slow":
        return dataclasses.replace(cluster, step_time_s=(t,) * (learners - 1) + (2 * t,))
    if scenario == "killed":
        return dataclasses.replace(cluster, failures=((learners - 1, run_s / 3, 2 * run_s / 3),))
    raise ValueError(f"scenario must be 'slow' or 'killed', not {scenario!r}")


def decoupling_configs(row: RunConfig, scenario: str, run_s: float) -> dict:
    """method -> (its config on the actor runtime, the lock-step method's config or None) in
    `scenario`, from `row` (the table's `decoupled` config): DiLoCo and Streaming DiLoCo as
    Decoupled DiLoCo's synchronous limit (module docstring), and Decoupled DiLoCo itself."""
    a, M = row.algorithm, row.workers
    cluster = scenario_cluster(row.cluster, M, scenario, run_s)
    elastic = scenario == "killed"
    sync = dict(quorum=M, grace_safety=0.0, merge="mean", down_bits=32, mix=0.0)
    H = a.inner_steps
    pairs = {
        "diloco": (DecoupledDiLoCo(inner_steps=H, fragments=1, overlap=0, bits=32, **sync),
                   DiLoCo(inner_steps=H, elastic=elastic)),
        "streaming": (DecoupledDiLoCo(inner_steps=H, fragments=a.fragments, overlap=a.overlap,
                                      bits=a.bits, **sync),
                      StreamingDiLoCo(inner_steps=H, fragments=a.fragments, overlap=a.overlap,
                                      bits=a.bits, mix=0.0, elastic=elastic)),
        "decoupled": (a, None),
    }
    out = {}
    for name, (algo, lock) in pairs.items():
        c = dataclasses.replace(row, algorithm=algo, cluster=cluster)
        out[name] = (c, None if lock is None else dataclasses.replace(c, algorithm=lock))
    return out


def measure(learners: int, steps: int, inner_steps: int, step_time_s: float, speeds: tuple,
            repeats: int,
            probe_steps: int, window: tuple, max_run_s: float, scenarios: tuple,
            call_bytes: bool, progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The table and the decoupling rows (module docstring), as `versus_table.cells`."""
    from . import versus_runs as vr

    began = time.perf_counter()
    say = lambda what: print(f"[versus] {time.perf_counter() - began:6.0f} s  {what}",  # noqa
                             flush=True)
    ddps = {n: c for n, c in methods(learners, steps, inner_steps).items() if "ddp" in n}
    # paced at half of t: close to the pace the table's runs get (t − t₀, t₀ ≈ 0.04–0.06 s)
    cal = vr.calibrate(learners, probe_steps, ddps, pace_s=step_time_s / 2)  # + DDP's curves
    t = max(step_time_s, cal["t_step"])  # the equal compute per step (module docstring)
    pace = t - cal["t_step"]
    say(f"calibrated: t0 = {cal['t_step']:.4f} s a step (paced to t = {t:.4f} s), "
        f"{cal['hop_s'] * 1e3:.2f} ms a hop")

    def cluster(gbit):
        return Cluster(step_time_s=t, link=Link(gbit_per_s=gbit, latency_s=cal["hop_s"]))

    table_cfgs = {g: methods(learners, steps, inner_steps, cluster(g)) for g in speeds}
    windows = {g: {n: tuple(window) for n in ("ddp", "ddp-bf16") if
                   vr.predicted_s(c[n], float(cal["curves"][n].comm_bytes.iloc[-1])
                                  / learners / steps) > max_run_s}
               for g, c in table_cfgs.items()}
    runs = vr.lockstep_runs({g: {n: c for n, c in cfgs.items() if n != "decoupled"}
                             for g, cfgs in table_cfgs.items()}, repeats, cal["curves"],
                            windows, pace_s=pace)
    say("lock-step rows: " + ", ".join(f"{g * 1e3:g} Mbit/s ({', '.join(w) or 'no'} windowed)"
                                       for g, w in windows.items()))
    # Decoupled DiLoCo: the table's runs, then (at the slowest link) Ray's bytes per call, then
    # the decoupling rows at AT, all on one Ray cluster; the simulated runs first
    sims = {g: vr.simulated(table_cfgs[g]["decoupled"]) for g in speeds}
    row = methods(learners, steps, inner_steps, cluster(AT))["decoupled"]
    res = sims[AT][1] if AT in sims else vr.simulated(row)[1]
    todo = [(scenario, name, c, lock) for scenario in scenarios
            for name, (c, lock) in decoupling_configs(row, scenario,
                                                      float(res.final.sim_time_s)).items()]
    entries = [dict(config=table_cfgs[g]["decoupled"], sim=sims[g], key="gbit_per_s",
                    value=g, repeat=r) for g in speeds for r in range(repeats)]
    probe_after = len(entries) if call_bytes else None
    entries += [dict(config=c, sim=vr.simulated(c), key="scenario", value=scenario, repeat=0)
                for scenario, _, c, _ in todo]
    say(f"simulated: {len(speeds)} table runs, {len(todo)} decoupling runs")
    got = vr.decoupled_runs(entries, probe_after, progress=progress)
    dec, druns = got[:len(speeds) * repeats], got[len(speeds) * repeats:]
    for run in dec:
        run.update(sim_outer_steps=float(sims[run["gbit_per_s"]][1].final.outer_steps))
    say(f"Decoupled DiLoCo: {len(dec)} table runs, {len(druns)} decoupling runs")
    table = speedups(cells(runs + dec))
    table = table.assign(learners=learners, steps=steps, inner_steps=inner_steps,
                         step_time_s=t, natural_step_s=cal["t_step"], hop_s=cal["hop_s"])
    print(markdown(table), flush=True)
    for run, (_, name, _, lock), e in zip(druns, todo, entries[len(dec):], strict=True):
        run.update(method=name, sim_goodput=float(e["sim"][1].final.goodput))
        if lock is not None:
            run["lockstep"] = vr.simulated(lock)[0]
    return table, cells(druns, by="scenario")


def reproduce_job(figures_dir, quick: bool) -> list[dict]:
    """`make reproduce`'s `versus` job: `measure(**settings(quick))`, the tables as
    `versus.csv` and `versus_decoupling.csv` (and as markdown, `versus.md`), the figure as
    `versus.png`, the results rows. Skipped, with a message, without Ray or the testbed."""
    from pathlib import Path

    from ..distributed.testbed import _unavailable

    try:
        import ray  # noqa: F401
    except ImportError:
        print("[reproduce] versus: Ray is not installed (pip install 'diloco_lite[cluster]'): "
              "skipped", flush=True)
        return []
    if _unavailable():
        print(f"[reproduce] versus: no testbed ({_unavailable()}): skipped", flush=True)
        return []
    table, decoupling = measure(**settings(quick))
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(figures_dir / "versus.csv", index=False)
    decoupling.to_csv(figures_dir / "versus_decoupling.csv", index=False)
    (figures_dir / "versus.md").write_text(  # docs/systems.md shows it
        markdown(table) + "\n\n" + decoupling_markdown(decoupling) + "\n")
    from ..plots import save
    from ..plots.versus import speedup_chart

    save(speedup_chart(table), "versus", figures_dir)
    return result_rows(table, decoupling)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco_lite.actors.versus",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    from ..devices import emulate_devices

    emulate_devices(1)
    began = time.perf_counter()
    table, decoupling = measure(**settings(args.quick))
    print(markdown(table) + "\n\n" + decoupling_markdown(decoupling))
    print(f"[versus] {time.perf_counter() - began:.0f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
