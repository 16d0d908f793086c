"""Measured against modelled (issue 17, part 3): the lock-step methods on the testbed's throttled
links, wall-clock and bytes on the wire beside what the simulated clock and the booking predict.

    python -m diloco_lite.distributed.measure                   # 4 hosts, 10 / 100 / 1000 Mbit/s
    python -m diloco_lite.distributed.measure --rates 0.01 --steps 20

Each host is one process of one device (M = `hosts` workers, the default model). Calibration,
on unthrottled links: a DiLoCo run with one sync in its measured window (H = half its steps)
gives the compute time of a step, t; a DDP run then gives the fixed cost of an exchange, spread
over its ring hops: h = (its time per step − t) / 2(M−1) (gloo's message round trips between
processes that share two cores, and the host round trip that each synchronous step takes:
milliseconds that no link rate removes); the clock charges h as the link's latency per hop
(`clock.exchange_cost`). Then, at each link rate, DDP and DiLoCo (H = `inner_steps`) run with
`Cluster(step_time_s=t, link=Link(rate, latency_s + h))` in their config, so that the history's
`sim_time_s` is the simulated clock's prediction for that very run. Per run:

- `wall_s_per_step`: measured over the run's second half (`_window`);
- `sim_s_per_step`: the simulated clock over the same steps; `ratio` = measured / simulated;
- `tx_per_host`: bytes that left each host's interface (mean over hosts), against
  `wire_model` = booked bytes per worker × gloo's factor (DDP: ring all-reduce 2(M−1)/M;
  DiLoCo: ring all-gather, M−1 payloads) — `testbed`'s docstring says why.

**Where the window starts matters** (the cause of the "120 ms per sync" this measurement once
showed on fast links). Every compilation (the inner steps, the sync's programs, the evaluator)
must fall before the window, and every process must enter it together. Process 0 alone
evaluates: when its first evaluation (which compiles the evaluator: seconds) opened the window,
the other processes had already run ahead into the next block on the shared cores, and process
0 then ran its share of the window nearly alone. With one sync per window that read the compute
time as 18 ms per step instead of the 36-43 ms that four processes on two cores take (what
this module reads now), and every DiLoCo prediction came out too fast by the difference (×1.35
and ×1.61 at 100 and 1000 Mbit/s).
Runs now evaluate every steps/4 steps (the evaluator compiles at steps/4), the window runs from
the row at steps/2 to the last, and each run is long enough that its window lasts about
`window_s` seconds at the rate it is measured at (`_steps`): a hiccup of the shared machine
then moves a ratio by a few percent, not by a third.

Not in `make test` (minutes); needs root and iproute2 (else the testbed falls back to loopback
and only the times are measured). Latency is emulated only where the kernel has netem.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from ..clock import Cluster, Link, exchange_cost
from ..config import DDP, DiLoCo, RunConfig
from .launch import launch
from .testbed import Testbed


def _window(history: pd.DataFrame, column: str) -> float:
    """Per step, from the history row at half the run's steps to the last row (the module
    docstring says why there)."""
    last = history.iloc[-1]
    first = history[history.step == last.step // 2].iloc[0]
    return float((last[column] - first[column]) / (last["step"] - first["step"]))


def _steps(s_per_step: float, least: int, multiple: int, window_s: float) -> int:
    """Steps of a run whose second half lasts about `window_s` at `s_per_step`: at least
    `least`, at most 12 × `least`, a multiple of `multiple` (4 H: its rows, every steps/4,
    and the window's start fall on sync boundaries)."""
    want = 2 * window_s / max(s_per_step, 1e-9)
    steps = int(np.clip(want, least, 12 * least))
    return -(-steps // multiple) * multiple


def _run(config: RunConfig, hosts: int, link: Link | None):
    with Testbed(hosts, link, quiet=True) as bed:
        before = bed.counters()
        [result] = launch(config, processes=hosts, devices_per_process=1, testbed=bed,
                          echo=False, timeout_s=1800)
        sent = bed.sent_since(before)
    return result, sent, bed.reason


def measure(hosts: int = 4, rates=(0.01, 0.1, 1.0), steps: int = 40, inner_steps: int = 10,
            latency_s: float = 0.0, window_s: float = 4.0) -> pd.DataFrame:
    """One row per (rate, method); see the module docstring. `steps` is the least number of
    steps of a run; runs on fast links take more, so that their measured half lasts about
    `window_s` seconds."""
    def config(algo, steps, cluster=None):
        return RunConfig(workers=hosts, steps=steps, eval_every=steps // 4, eval_batches=1,
                         algorithm=algo, cluster=cluster)

    # calibration on unthrottled links: H = half the steps (its first sync, which compiles,
    # opens the window; its second closes it)
    probe_steps = 4 * steps
    probe, _, reason = _run(config(DiLoCo(inner_steps=probe_steps // 2), probe_steps), hosts,
                            None)
    if reason:
        print(f"measure: {reason}: times only, on loopback", file=sys.stderr)
    t_step = _window(probe.history, "wall_time_s")
    hops = exchange_cost(hosts, gather=False)[1]
    ddp, _, _ = _run(config(DDP(), probe_steps), hosts, None)
    ddp_free = _window(ddp.history, "wall_time_s")
    hop_s = max(0.0, ddp_free - t_step) / max(hops, 1)
    # the bytes each method books per exchange and worker, to size the runs
    per_exchange = {"ddp": float(ddp.history.iloc[-1].comm_bytes) / hosts / probe_steps,
                    "diloco": float(probe.history.iloc[-1].comm_bytes) / hosts / 2}
    rows = []
    for rate in rates:
        cluster = Cluster(step_time_s=t_step,
                          link=Link(gbit_per_s=rate, latency_s=latency_s + hop_s))
        for algo in (DDP(), DiLoCo(inner_steps=inner_steps)):
            factor, n_hops = exchange_cost(hosts, gather=not isinstance(algo, DDP))
            every = 1 if isinstance(algo, DDP) else inner_steps
            guess = t_step + (n_hops * (latency_s + hop_s)
                              + factor * per_exchange[algo.name] * 8 / (rate * 1e9)) / every
            run_steps = _steps(guess, steps, 4 * every, window_s)
            result, sent, _ = _run(config(algo, run_steps, cluster), hosts, cluster.link)
            h = result.history
            wall, sim = _window(h, "wall_time_s"), _window(h, "sim_time_s")
            booked = float(h.iloc[-1].comm_bytes) / hosts  # per worker = per host here
            tx = float(np.mean([s["tx_bytes"] for s in sent])) if sent else np.nan
            retrans = int(sum(s["retrans_segs"] for s in sent)) if sent else -1
            rows.append({"gbit_per_s": rate, "method": algo.name, "steps": run_steps,
                         "step_time_s": t_step, "hop_s": hop_s,
                         "wall_s_per_step": wall, "sim_s_per_step": sim, "ratio": wall / sim,
                         "wall_s_run": float(h.iloc[-1].wall_time_s),
                         "sim_s_run": float(h.iloc[-1].sim_time_s),
                         "booked_per_worker": booked, "wire_model": booked * factor,
                         "tx_per_host": tx, "tx_over_model": tx / (booked * factor),
                         "retrans_segs": retrans})
            print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    slow = table[table.gbit_per_s == min(rates)].set_index("method")
    print(f"\nat {min(rates):g} Gbit/s, DiLoCo H={inner_steps} over DDP, same tokens: measured "
          f"{slow.wall_s_per_step['ddp'] / slow.wall_s_per_step['diloco']:.2f}x, simulated "
          f"{slow.sim_s_per_step['ddp'] / slow.sim_s_per_step['diloco']:.2f}x")
    return table


def settings(quick: bool) -> dict:
    """The measurement `make reproduce` (job `links`) and notebook 07 run: 4 hosts at 10 / 100 /
    1000 Mbit/s, runs of ≥ 40 steps measured over ~4 s, DiLoCo H = 10; quick: 2 hosts at 100
    Mbit/s, ≥ 12 steps over ~1 s, H = 4."""
    if quick:
        return dict(hosts=2, rates=(0.1,), steps=12, inner_steps=4, window_s=1.0)
    return dict(hosts=4, rates=(0.01, 0.1, 1.0), steps=40, inner_steps=10, window_s=4.0)


def describe(hosts: int, rates, steps: int, inner_steps: int, latency_s: float = 0.0,
             window_s: float = 4.0, emulated: bool = True) -> str:
    """The config column of the `links` rows."""
    where = "testbed hosts" if emulated else "processes on loopback (no testbed: times only)"
    return (f"{hosts} {where} of 1 CPU device, default model, runs of >= {steps} steps "
            f"measured over ~{window_s:g} s, DiLoCo H="
            f"{inner_steps}; links {', '.join(f'{r * 1e3:g}' for r in rates)} Mbit/s, latency "
            f"{latency_s * 1e3:g} ms")


def result_rows(table: pd.DataFrame, config: str) -> list[dict]:
    """The results table's rows of a `measure()` table: per method and link rate, measured /
    simulated seconds per step and bytes on the wire / the model; at the slowest link, DiLoCo's
    speed-up over DDP for the same tokens, measured and simulated."""
    rows = []
    for r in table.itertuples():
        at = f"@{r.gbit_per_s * 1e3:g} Mbit/s"
        rows.append(dict(experiment="links", method=r.method, value=float(r.ratio),
                         metric=f"measured / simulated s per step {at}", config=config))
        if r.tx_over_model == r.tx_over_model:  # not NaN: the testbed counted the bytes
            rows.append(dict(experiment="links", method=r.method, value=float(r.tx_over_model),
                             metric=f"bytes on the wire / booked x collective factor {at}",
                             config=config))
    rate = table.gbit_per_s.min()
    slow = table[table.gbit_per_s == rate].set_index("method")
    if {"ddp", "diloco"} <= set(slow.index):
        for clock, column in (("measured", "wall_s_per_step"), ("simulated", "sim_s_per_step")):
            rows.append(dict(
                experiment="links", method="diloco", config=config,
                metric=f"wall-clock speed-up over DDP, {clock} @{rate * 1e3:g} Mbit/s",
                value=float(slow[column]["ddp"] / slow[column]["diloco"]),
                published=20.0 if clock == "measured" else None))
    return rows


def reproduce_job(figures_dir, quick: bool) -> list[dict]:
    """`make reproduce`'s `links` job: `measure(**settings(quick))`, the figures `links_time`
    and (where the testbed counted bytes) `links_bytes`, the table as `links.csv`, and the
    results rows (`result_rows`)."""
    from pathlib import Path

    from ..plots import links as lplots
    from ..plots import save

    run = settings(quick)
    table = measure(**run)
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(figures_dir / "links.csv", index=False)
    save(lplots.time_chart(table), "links_time", figures_dir)
    emulated = bool(table.tx_per_host.notna().any())
    if emulated:
        save(lplots.bytes_chart(table), "links_bytes", figures_dir)
    return result_rows(table, describe(**run, emulated=emulated))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco_lite.distributed.measure",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rates", default="0.01,0.1,1", help="Gbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--window-s", type=float, default=4.0)
    args = parser.parse_args(argv)
    table = measure(args.hosts, tuple(float(r) for r in args.rates.split(",")), args.steps,
                    args.inner_steps, args.latency_ms / 1e3, args.window_s)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
