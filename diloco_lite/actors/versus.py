"""Decoupled DiLoCo against data-parallel training (DDP) over slow links, measured on the testbed:
the seeds' "20× faster than data-parallel over slow links" at classroom scale.

    python -m diloco_lite.actors.versus            # 4 learner hosts + the syncer's, ~25 minutes
    python -m diloco_lite.actors.versus --quick

Both methods train the default model on the same tokens: M workers, `steps` steps, on M testbed
hosts (`distributed.testbed`: network namespaces behind `tc`-shaped links, each host's link
`gbit_per_s` up and down), at four link speeds, from where DDP is compute-bound (1 Gbit/s) to
where it is link-bound (1 Mbit/s). Decoupled DiLoCo runs with the paper's settings where they
fit: 4-bit answers, P = 4 fragments, K = 1, the adaptive grace window, H = 40 (at 1 Mbit/s the
syncer's link carries the M copies of a round in about half of H steps); the learners' steps
padded to `step_time_s`.

- **How a published fragment reaches M learners.** The syncer's host sends one reply per learner
  through its own link (M copies: the simulated clock charges them, `clock.Links.fan_out`), and
  sends them as 4-bit outer updates (`down_bits = 4`): M copies of an eighth of the fragment, half
  of one fp32 copy for M = 4. No relay or tree: the quantized down-link is the one choice that
  changes no message's path, and it is the reason `down_bits` is not 32 here.
- **DDP's clock.** Its loss per step does not depend on the link, so its loss curve comes from one
  run of `steps` steps on this machine's loopback (`distributed.launch`, M processes of one
  device), which also gives its compute seconds per step (`train_time_s`: evaluations left out).
  Its seconds per step at each link speed come from a short run on the testbed (`window` steps
  after a first block of as many, which compiles; evaluations left out). Its time to a loss =
  the steps its curve needs × those seconds per step.
- **Decoupled DiLoCo's clock** is the run itself at each speed (`hosts.train_on_testbed`): the
  clock starts once every learner is ready (compilation left out) and the fragments are
  evaluated after the run (evaluations left out).
- **The same target loss on both sides**: the worse of the two final held-out losses; the
  speed-up is DDP's time to it over Decoupled DiLoCo's.
- **The simulated clock** runs the same configs: DDP with the compute seconds per step measured on
  loopback (not fitted to a throttled run), the learners at `step_time_s`; its speed-up is taken
  the same way, to the worse of its two final losses.
- **Bytes on the wire**: every host's interface counters during the run (the learners' and the
  syncer's), beside the bytes the run booked for it (its answers and replies) and its control
  traffic (`control`: Ray's bytes per empty call, measured at the same link speed by
  `hosts.call_bytes`, times the calls the syncer counted; each byte the calls carried beyond an
  empty call's, booked or not (the messages, reports and arrays' headers they pickle to), at what
  a payload byte costs on the wire with TCP's headers and ACKs; the nodes' idle traffic), up
  and down.

Not in `make test` (minutes, root); `make reproduce`'s `versus` job runs it where Ray and the
testbed exist.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pandas as pd

from ..clock import Cluster, Link
from ..config import DDP, DecoupledDiLoCo, RunConfig
from .measure import command, time_to

MBIT = 1e-3  # Gbit/s


def settings(quick: bool) -> dict:
    """The measurement of `make reproduce` (job `versus`); quick: 2 learners, 60 steps."""
    if quick:
        return dict(learners=2, steps=60, inner_steps=12, step_time_s=0.1,
                    speeds=(100 * MBIT, 1 * MBIT), window=(6, 2))
    return dict(learners=4, steps=240, inner_steps=40, step_time_s=0.1,
                speeds=(1000 * MBIT, 100 * MBIT, 10 * MBIT, 1 * MBIT), window=(20, 20, 10, 5))


def configs(learners: int, steps: int, inner_steps: int, step_time_s: float,
            gbit_per_s: float = float("inf")) -> dict[str, RunConfig]:
    """{"ddp", "decoupled"}: the two runs (module docstring) behind links of `gbit_per_s`."""
    cluster = Cluster(step_time_s=step_time_s, link=Link(gbit_per_s=gbit_per_s))
    base = RunConfig(algorithm=DDP(), workers=learners, steps=steps,
                     eval_every=max(1, steps // 12), eval_batches=2, cluster=cluster)
    algo = DecoupledDiLoCo(inner_steps=inner_steps, fragments=4, overlap=2, bits=4, down_bits=4,
                           quorum=1, grace_safety=0.5)
    return {"ddp": base, "decoupled": dataclasses.replace(base, algorithm=algo)}


def steps_to(history: pd.DataFrame, loss: float) -> float:
    """The step at which the held-out loss first reaches `loss`, linearly interpolated between
    evaluations; NaN if it never does."""
    return time_to(history, loss, "step")


def seconds_to(history: pd.DataFrame, loss: float) -> float:
    """Likewise the run's clock (`sim_time_s`: for a run on actors, the real one)."""
    return time_to(history, loss)


def seconds_per_step(history: pd.DataFrame) -> float:
    """A run's seconds per step from its first evaluation (after its first block, which
    compiles) to its last, evaluations left out (`train_time_s`)."""
    h = history
    return float((h.train_time_s.iloc[-1] - h.train_time_s.iloc[0])
                 / (h.step.iloc[-1] - h.step.iloc[0]))


def versus_ddp(learners: int, steps: int, inner_steps: int, step_time_s: float, speeds: tuple,
               window: tuple, progress: bool = True) -> pd.DataFrame:
    """One row per link speed (module docstring): DDP's and Decoupled DiLoCo's time to the same
    loss, measured and simulated, their speed-ups, and each learner host's bytes on the wire
    beside the booked ones."""
    from ..distributed.launch import launch
    from ..distributed.testbed import Testbed
    from ..training import train
    from .hosts import call_bytes, train_on_testbed

    free = configs(learners, steps, inner_steps, step_time_s)
    [ddp] = launch(free["ddp"], processes=learners, devices_per_process=1, echo=False,
                   timeout_s=1800)  # the loss curve and the compute time, on loopback
    compute_s = seconds_per_step(ddp.history)
    rows = []
    for gbit, n in zip(speeds, window, strict=True):
        cfgs = configs(learners, steps, inner_steps, step_time_s, gbit)
        # evaluated after n steps (the first block compiles) and after 2n: one evaluation in
        # the window (process 0 evaluates while the others go on to the next step's compute)
        probe = dataclasses.replace(cfgs["ddp"], steps=2 * n, eval_every=n)
        with Testbed(learners, cfgs["ddp"].cluster.link, quiet=True) as bed:
            [short] = launch(probe, processes=learners, devices_per_process=1, testbed=bed,
                             echo=False, timeout_s=1800)
        with Testbed(learners + 1, cfgs["decoupled"].cluster.link, quiet=True) as bed:
            dec = train_on_testbed(cfgs["decoupled"], bed, progress=progress)
            emulated = bed.emulated
            # Ray's bytes per call at this link speed, with payloads of the answers' size
            per_call = call_bytes(bed, payload=_payload_size(dec)) if emulated else None
        sim_ddp = train(dataclasses.replace(cfgs["ddp"], cluster=Cluster(
            step_time_s=compute_s, link=cfgs["ddp"].cluster.link)), progress=False)
        sim_dec = train(cfgs["decoupled"], progress=False)
        row = dict(gbit_per_s=gbit, emulated=emulated, learners=learners, steps=steps,
                   inner_steps=inner_steps, step_time_s=step_time_s, ddp_compute_s=compute_s,
                   ddp_s_per_step=seconds_per_step(short.history),
                   sim_ddp_s_per_step=float(sim_ddp.history.sim_time_s.iloc[-1]) / steps)
        target = max(float(ddp.final.val_loss), float(dec.final.val_loss))
        row.update(target_loss=target, ddp_steps=steps_to(ddp.history, target),
                   dec_s=seconds_to(dec.history, target))
        row["ddp_s"] = row["ddp_steps"] * row["ddp_s_per_step"]
        sim_target = max(float(sim_ddp.final.val_loss), float(sim_dec.final.val_loss))
        row.update(sim_target_loss=sim_target, sim_ddp_s=seconds_to(sim_ddp.history, sim_target),
                   sim_dec_s=seconds_to(sim_dec.history, sim_target))
        row["speedup"] = row["ddp_s"] / row["dec_s"]
        row["sim_speedup"] = row["sim_ddp_s"] / row["sim_dec_s"]
        row["outer_steps"] = int(dec.final.outer_steps)
        row["sim_outer_steps"] = int(sim_dec.final.outer_steps)
        row.update(wire_rows(dec, per_call))
        rows.append(row)
        print(pd.Series(row).to_string(), flush=True)
    return pd.DataFrame(rows)


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


def ratio(row, what: str):
    """Bytes on the wire ÷ (booked + control) of `what` ("up", "down", "syncer_up", ...) in a
    table row (or, column by column, in the whole table)."""
    return row[f"{what}_wire"] / (row[f"{what}_booked"] + row[f"{what}_control"])


def result_rows(table: pd.DataFrame) -> list[dict]:
    """The results table's rows: per link speed, the speed-up measured and simulated, and a
    learner host's bytes on the wire / booked, up and down."""
    rows = []
    for r in table.to_dict("records"):
        at = f"@{r['gbit_per_s'] * 1e3:g} Mbit/s"
        config = (f"{r['learners']} learners on testbed hosts (+ the syncer's), default model, "
                  f"{r['steps']} steps, H={r['inner_steps']}, P=4, tau=2, 4-bit up and down, "
                  f"K=1, grace; DDP on {r['learners']} hosts; same tokens; evaluations and "
                  "compilation left out")
        for clock, key in (("measured", "speedup"), ("simulated", "sim_speedup")):
            rows.append(dict(experiment="versus", method="decoupled vs ddp", config=config,
                             metric=f"wall-clock speed-up over DDP to the same loss, {clock} {at}",
                             value=float(r[key]), published=20.0 if clock == "measured" else None))
        for host, prefix in (("a learner host's", ""), ("the syncer's host's", "syncer_")):
            for way in ("up", "down"):
                if np.isfinite(r.get(f"{prefix}{way}_control", np.nan)):
                    rows.append(dict(
                        experiment="versus", method="decoupled vs ddp", config=config,
                        metric=f"{host} bytes on the wire / booked with the control traffic, "
                               f"{way} {at}",
                        value=ratio(r, prefix + way)))
    return rows


def markdown(table: pd.DataFrame) -> str:
    """`table` (one row per link speed) as the markdown table docs/systems.md shows (a test
    holds the two together)."""
    lines = ["| link per host | DDP s/step, measured / clock | DDP steps to the target | "
             "DDP s to it | Decoupled s to it | speed-up, measured | simulated | "
             "measured ÷ simulated | wire ÷ (booked + control), a learner's host, up / down | "
             "the syncer's host, up / down |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table.to_dict("records"):
        wire = ["–"] * 2
        for i, at in enumerate(("", "syncer_")):
            if np.isfinite(r.get(f"{at}up_control", np.nan)):
                wire[i] = " / ".join(f"{ratio(r, at + w):.2f}" for w in ("up", "down"))
        lines.append(
            f"| {r['gbit_per_s'] * 1e3:g} Mbit/s | {r['ddp_s_per_step']:.3g} / "
            f"{r['sim_ddp_s_per_step']:.3g} | {r['ddp_steps']:.0f} | {r['ddp_s']:.1f} | "
            f"{r['dec_s']:.1f} | **{r['speedup']:.2f}×** | {r['sim_speedup']:.2f}× | "
            f"{r['speedup'] / r['sim_speedup']:.2f} | {wire[0]} | {wire[1]} |")
    return "\n".join(lines)


def _payload_size(result) -> int:
    """The mean booked bytes of one answer of a run (4-bit answers and replies alike)."""
    answers = sum(f["syncs"] for f in result.plan.fragments)
    return max(1, round(float(result.final.comm_bytes) / max(answers, 1)
                        / result.config.workers))


def reproduce_job(figures_dir, quick: bool) -> list[dict]:
    """`make reproduce`'s `versus` job: `versus_ddp(**settings(quick))`, the table as
    `versus.csv` (and as markdown, `versus.md`), its figure as `versus.png`, the results rows.
    Skipped, with a message, without Ray or the testbed."""
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
    table = versus_ddp(**settings(quick))
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(figures_dir / "versus.csv", index=False)
    (figures_dir / "versus.md").write_text(markdown(table) + "\n")  # docs/systems.md shows it
    from ..plots import save
    from ..plots.versus import speedup_chart

    save(speedup_chart(table), "versus", figures_dir)
    return result_rows(table)


def main(argv=None) -> int:
    return command(argv, "python -m diloco_lite.actors.versus", __doc__,
                   lambda quick: versus_ddp(**settings(quick)))


if __name__ == "__main__":
    sys.exit(main())
