"""Measured against modelled (issue 18, part 3): Decoupled DiLoCo on real actors beside the
simulated clock's prediction for the same `Cluster`.

    python -m diloco_lite.actors.measure            # 4 learners, the default model, ~6 minutes
    python -m diloco_lite.actors.measure --quick

Every scenario runs the same config twice: on Ray actors (`train_actors`: real processes, real
waits, real kills) and on the simulated clock (`train`). The learners' step times are the
`Cluster`'s (padded: a real step takes its compute, then waits out the rest), so both clocks
see the same speeds; what the simulated clock does not know is what reality adds:

- `equal`: every learner at `step_time_s`;
- `slow`: the last learner twice as slow;
- `failures`: learners killed at a known rate (`FailureRate(mtbf_s, down_s)`, seeded). On
  actors a failure is a real kill (`ray.kill`) at the window's start; the syncer hears of it
  at once (`detect_s`), and a warm spare (`actors.pool`) takes the learner's place: ready at
  the kill (`ready_s`: from the kill until the process that serves next runs; a spare not
  rebuilt yet after an earlier kill takes longer), it waits out the window, rejoins and
  steps again (`first_step_s`: from the window's end to its first step, what the simulated
  clock does not know of; `restart_s`: from the death heard of to the rejoin). The simulated
  clock is also run with the failure windows that really happened (from the logged kill to
  the rejoin: `real_windows`), the measured delay folded back into the model.

Per scenario: the run's seconds (its last row), its goodput, and the time to reach lock-step
DiLoCo's final held-out loss (the same tokens, on the simulated clock; where a run never gets
there, the worse of the two runs' final losses), measured and simulated, with their ratios;
for `failures` also the number of failures, `detect_s`, `restart_s`, `ready_s` and
`first_step_s`; for every scenario the syncer's CPU share while the learners step
(`syncer_cpu`) and while idle (`syncer_idle_cpu`), and the messages resent.
Not in `make test` (minutes); `make reproduce`'s `actors` job runs it where Ray is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import numpy as np
import pandas as pd

from ..clock import Cluster, FailureRate
from ..config import DecoupledDiLoCo, DiLoCo, RunConfig


def settings(quick: bool) -> dict:
    """The measurement of `make reproduce` (job `actors`); quick: 3 learners, 60 steps."""
    if quick:
        return dict(learners=3, steps=60, inner_steps=10, step_time_s=0.15, mtbf_s=6.0,
                    down_s=3.0)
    return dict(learners=4, steps=240, inner_steps=20, step_time_s=0.15, mtbf_s=30.0,
                down_s=6.0)


def configs(learners: int, steps: int, inner_steps: int, step_time_s: float, mtbf_s: float,
            down_s: float) -> dict[str, RunConfig]:
    """Scenario -> the Decoupled DiLoCo run (module docstring), plus "target": lock-step DiLoCo
    with the same tokens, whose final held-out loss is the target."""
    algo = DecoupledDiLoCo(inner_steps=inner_steps, fragments=4, overlap=2, bits=4, quorum=1,
                           grace_safety=0.5, merge="rda")
    base = RunConfig(algorithm=algo, workers=learners, steps=steps, eval_every=steps // 12,
                     eval_batches=2)
    t = step_time_s
    return {
        "equal": dataclasses.replace(base, cluster=Cluster(step_time_s=t)),
        "slow": dataclasses.replace(base, cluster=Cluster(
            step_time_s=(t,) * (learners - 1) + (2 * t,))),
        "failures": dataclasses.replace(base, cluster=Cluster(
            step_time_s=t, failures=FailureRate(mtbf_s=mtbf_s, down_s=down_s), seed=0)),
        "target": dataclasses.replace(base, algorithm=DiLoCo(inner_steps=inner_steps),
                                      cluster=Cluster(step_time_s=t)),
    }


def time_to(history: pd.DataFrame, loss: float, column: str = "sim_time_s") -> float:
    """Seconds (`sim_time_s`, or another `column`: "step") at which the held-out loss first
    reaches `loss`, linearly interpolated between rows; NaN if it never does."""
    t, v = history[column].to_numpy(float), history.val_loss.to_numpy(float)
    hit = np.flatnonzero(v <= loss)
    if not hit.size:
        return float("nan")
    i = hit[0]
    if i == 0:
        return float(t[0])
    return float(t[i - 1] + (t[i] - t[i - 1]) * (v[i - 1] - loss) / (v[i - 1] - v[i]))


def real_windows(result) -> tuple:
    """The failure windows that happened on actors, from the run's log: (learner, kill time,
    rejoin time, the time the syncer learned of the death). Each logged `kill` opens a window
    that the learner's next `rejoin` closes (math.inf if it never came back); a kill while the
    learner was still down (its new process starting, or waiting to rejoin) extends the window
    it fell in: the learner really was down from the first kill to the rejoin."""
    log = sorted(result.log, key=lambda e: e[0])
    of = lambda kind: [(t, m) for t, k, m, _ in log if k == kind]  # noqa: E731
    fails, rejoins = of("fail"), of("rejoin")
    out = []
    for kill, m in sorted(of("kill"), key=lambda e: (e[1], e[0])):
        back = next((t for t, q in rejoins if q == m and t > kill), math.inf)
        if out and out[-1][0] == m and kill <= out[-1][2]:  # still down: one window
            continue
        seen = next((t for t, q in fails if q == m and kill <= t <= back), math.nan)
        out.append((m, kill, back, seen))
    return tuple(out)


def measure(learners: int = 4, steps: int = 240, inner_steps: int = 20,
            step_time_s: float = 0.15, mtbf_s: float = 30.0, down_s: float = 6.0,
            progress: bool = False) -> pd.DataFrame:
    """One row per scenario (module docstring)."""
    from ..training import train
    from .runtime import train_actors

    runs = configs(learners, steps, inner_steps, step_time_s, mtbf_s, down_s)
    target = float(train(runs.pop("target"), progress=progress).final.val_loss)
    rows = []
    for name, config in runs.items():
        real = train_actors(config, progress=progress, idle_s=3.0)
        sim = train(config, progress=progress)
        # the target: DiLoCo's final loss, or the worse of the two runs' when one misses it
        worst = max(float(real.final.val_loss), float(sim.final.val_loss))
        loss = max(target, worst)
        row = dict(scenario=name, learners=learners, steps=steps, step_time_s=step_time_s,
                   target_loss=loss, target="DiLoCo's final" if loss == target else
                   "the worse final of the two")
        for clock, r in (("real", real), ("sim", sim)):
            row[f"{clock}_s"] = float(r.final.sim_time_s)
            row[f"{clock}_goodput"] = float(r.final.goodput)
            row[f"{clock}_to_target_s"] = time_to(r.history, loss)
            row[f"{clock}_val_loss"] = float(r.final.val_loss)
            row[f"{clock}_failures"] = int(r.final.failures)
        cpu = real.runtime["cpu"]
        row.update(syncer_cpu=cpu["run_cpu_s"] / cpu["run_s"],
                   syncer_idle_cpu=cpu["idle_cpu_s"] / cpu["idle_s"],
                   resent=real.runtime["resent"], restamped=real.runtime["restamped"],
                   clock_offset_s=real.runtime["clock"]["max_abs_offset_s"])
        if name == "failures":
            row.update(replacement_times(real.runtime["kills"]))
            windows = real_windows(real)
            detect = [d - k for _, k, _, d in windows if np.isfinite(d)]
            restart = [b - d for _, _, b, d in windows if np.isfinite(b) and np.isfinite(d)]
            row["detect_s"] = float(np.mean(detect)) if detect else np.nan
            row["restart_s"] = float(np.mean(restart)) if restart else np.nan
            folded = dataclasses.replace(config, cluster=dataclasses.replace(
                config.cluster, failures=tuple((m, k, b) for m, k, b, _ in windows)))
            again = train(folded, progress=progress)
            row["folded_s"] = float(again.final.sim_time_s)
            row["folded_goodput"] = float(again.final.goodput)
            row["folded_to_target_s"] = time_to(again.history, loss)
        rows.append(row)
        print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    for what in ("s", "goodput", "to_target_s"):
        table[f"ratio_{what}"] = table[f"real_{what}"] / table[f"sim_{what}"]
        if f"folded_{what}" in table:
            table[f"folded_ratio_{what}"] = table[f"real_{what}"] / table[f"folded_{what}"]
    return table


def describe(learners: int, steps: int, inner_steps: int, step_time_s: float, mtbf_s: float,
             down_s: float) -> str:
    """The config column of the `actors` rows."""
    return (f"{learners} learners on Ray actors (1 CPU device each, loopback), default model, "
            f"{steps} steps, H={inner_steps}, P=4, tau=2, 4-bit, K=1, RDA; {step_time_s:g} s "
            f"per step; failures every {mtbf_s:g} s per learner, down {down_s:g} s")


def replacement_times(kills: list) -> dict:
    """Per run, what its killed learners' replacements took (`RunResult.runtime["kills"]`):
    `ready_s` (from a kill until the next process runs) and `first_step_s` (from the window's
    end until its first step), their mean and their largest (`max_...`); NaN without any."""
    out = {}
    for key in ("ready_s", "first_step_s"):
        got = [k[key] for k in kills if np.isfinite(k[key])]
        out[key] = float(np.mean(got)) if got else np.nan
        out[f"max_{key}"] = float(np.max(got)) if got else np.nan
    return out


def result_rows(table: pd.DataFrame, config: str) -> list[dict]:
    """The results table's rows: per scenario, measured / simulated run seconds, goodput and
    time to lock-step DiLoCo's final loss; for `failures`, also against the simulated clock
    given the windows that really happened, and the measured detection and restart times."""
    rows = []
    names = {"s": "run seconds", "goodput": "goodput", "to_target_s": "time to DiLoCo's loss"}
    for r in table.to_dict("records"):
        for what, label in names.items():
            rows.append(dict(experiment="actors", method=f"decoupled ({r['scenario']})",
                             metric=f"measured / simulated {label}",
                             value=float(r[f"ratio_{what}"]), config=config))
            if r["scenario"] == "failures":
                rows.append(dict(experiment="actors", method="decoupled (failures)",
                                 metric=f"measured / simulated {label}, real failure windows",
                                 value=float(r[f"folded_ratio_{what}"]), config=config))
        if r["scenario"] == "failures":
            for key, label in (("detect_s", "kill until the syncer hears of it (s)"),
                               ("restart_s", "death heard of until the rejoin (s)"),
                               ("ready_s", "kill until the next process runs (s)"),
                               ("first_step_s", "window's end until the first step (s)")):
                rows.append(dict(experiment="actors", method="decoupled (failures)",
                                 metric=label, value=float(r[key]), config=config))
    return rows


def reproduce_job(figures_dir, quick: bool) -> list[dict]:
    """`make reproduce`'s `actors` job: `measure(**settings(quick))`, the table as
    `actors.csv`, the results rows. Skipped, with a message, where Ray is not installed."""
    from pathlib import Path

    try:
        import ray  # noqa: F401
    except ImportError:
        print("[reproduce] actors: Ray is not installed (pip install 'diloco_lite[cluster]'): "
              "skipped", flush=True)
        return []
    run = settings(quick)
    table = measure(**run)
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(figures_dir / "actors.csv", index=False)
    return result_rows(table, describe(**run))


def main(argv=None) -> int:
    return command(argv, "python -m diloco_lite.actors.measure", __doc__,
                   lambda quick: measure(**settings(quick), progress=True))


def command(argv, prog: str, doc: str, run) -> int:
    """A measurement's command line: `--quick`, then `run(quick)`'s table, printed."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    from ..devices import emulate_devices

    emulate_devices(1)
    table = run(args.quick)
    print(table.T.to_string(float_format=lambda x: f"{x:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
