"""Measured against modelled (issue 17, part 3): the lock-step methods on the testbed's throttled
links, wall-clock and bytes on the wire beside what the simulated clock and the booking predict.

    python -m diloco_lite.distributed.measure                   # 4 hosts, 10 / 100 / 1000 Mbit/s
    python -m diloco_lite.distributed.measure --rates 0.01 --steps 20

Each host is one process of one device (M = `hosts` workers, the default model). First one
DiLoCo run on unthrottled links (H = `steps`/2: the second half is all compute) measures the
compute time of a step, t. Then, at each link rate, DDP and DiLoCo (H = `inner_steps`) run with
`Cluster(step_time_s=t, link=Link(rate))` in their config, so that the history's `sim_time_s`
is the simulated clock's prediction for that very run. Per run:

- `wall_s_per_step`: measured, over the second half of the run (compilation is in the first);
- `sim_s_per_step`: the simulated clock over the same steps; `ratio` = measured / simulated;
- `tx_per_host`: bytes that left each host's interface (mean over hosts), against
  `wire_model` = booked bytes per worker × gloo's factor (DDP: ring all-reduce 2(M−1)/M;
  DiLoCo: ring all-gather, M−1 payloads) — `testbed`'s docstring says why.

Not in `make test` (minutes); needs root and iproute2 (else the testbed falls back to loopback
and only the times are measured). Latency is emulated only where the kernel has netem.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import pandas as pd

from ..clock import Cluster, Link, exchange_cost
from ..config import DDP, DiLoCo, RunConfig
from .launch import launch
from .testbed import Testbed


def _second_half(history: pd.DataFrame, column: str) -> float:
    """Per step, between the first and the last history row."""
    first, last = history.iloc[0], history.iloc[-1]
    return float((last[column] - first[column]) / (last["step"] - first["step"]))


def _run(config: RunConfig, hosts: int, link: Link | None):
    with Testbed(hosts, link, quiet=True) as bed:
        before = bed.counters()
        [result] = launch(config, processes=hosts, devices_per_process=1, testbed=bed,
                          echo=False, timeout_s=1800)
        sent = bed.sent_since(before)
    return result, sent, bed.reason


def measure(hosts: int = 4, rates=(0.01, 0.1, 1.0), steps: int = 40, inner_steps: int = 10,
            latency_s: float = 0.0) -> pd.DataFrame:
    """One row per (rate, method); see the module docstring."""
    base = RunConfig(workers=hosts, steps=steps, eval_every=steps // 2, eval_batches=1)
    # H = steps / 2: its one sync in the first half compiles the sync, its second (free link)
    # costs milliseconds: the second half is compute
    probe, _, reason = _run(dataclasses.replace(base, algorithm=DiLoCo(inner_steps=steps // 2)),
                            hosts, None)
    if reason:
        print(f"measure: {reason}: times only, on loopback", file=sys.stderr)
    t_step = _second_half(probe.history, "wall_time_s")
    rows = []
    for rate in rates:
        cluster = Cluster(step_time_s=t_step, link=Link(gbit_per_s=rate, latency_s=latency_s))
        for algo in (DDP(), DiLoCo(inner_steps=inner_steps)):
            factor, _ = exchange_cost(hosts, gather=not isinstance(algo, DDP))
            config = dataclasses.replace(base, algorithm=algo, cluster=cluster)
            result, sent, _ = _run(config, hosts, cluster.link)
            h = result.history
            wall, sim = _second_half(h, "wall_time_s"), _second_half(h, "sim_time_s")
            booked = float(h.iloc[-1].comm_bytes) / hosts  # per worker = per host here
            tx = float(np.mean([s["tx_bytes"] for s in sent])) if sent else np.nan
            retrans = int(sum(s["retrans_segs"] for s in sent)) if sent else -1
            rows.append({"gbit_per_s": rate, "method": algo.name, "step_time_s": t_step,
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco_lite.distributed.measure",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rates", default="0.01,0.1,1", help="Gbit/s, comma-separated")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    table = measure(args.hosts, tuple(float(r) for r in args.rates.split(",")), args.steps,
                    args.inner_steps, args.latency_ms / 1e3)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
