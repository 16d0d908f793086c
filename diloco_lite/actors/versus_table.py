"""The arithmetic of `actors.versus`: from the runs it measured to its table, no measuring here.

A *run* is one repeat of one method at one link speed (or, for the decoupling rows, in one
scenario), a dict:

- `gbit_per_s` (or `scenario`), `method` (one of `METHODS`), `repeat`, `how` ("end to end" or
  "window of N steps": how its seconds were measured);
- `measured`: a DataFrame [step, val_loss, time_s], the held-out loss at each evaluation
  against the run's measured seconds since its clock started (compilation and evaluations left
  out, the end-of-run flush inside);
- `simulated`: the same for the simulated clock's run of the same config;
- any other scalars (bytes on the wire, goodput, ...): the cell holds their mean over repeats;
- for the decoupling rows, `lockstep` (optional): [step, val_loss, time_s] of the lock-step
  method itself (not its synchronous limit on actors) on the simulated clock, a reference.

`cells(runs)` gives one row per (speed, method): the target at that speed (the worst final
held-out loss among every run there, every method and repeat, measured or on the simulated
clock: the loss every curve reaches; the clock's own target, for its speed-ups, likewise among
its runs alone), each method's seconds to it (median of the repeats, with the min and max),
the simulated seconds beside them, and the speed-up over DDP.
`decomposition(table)` splits Decoupled DiLoCo's speed-up over DDP, at each speed, into the
communication cut (Streaming DiLoCo's speed-up over DDP: the same H, fragments, τ and bits, in
lock-step) and the decoupling (Streaming's seconds over Decoupled's): their product.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .measure import time_to

METHODS = ("ddp", "ddp-bf16", "diloco", "diloco-4bit", "streaming", "decoupled")
LABELS = {"ddp": "DDP, fp32 gradients", "ddp-bf16": "DDP, bf16 gradients",
          "diloco": "DiLoCo, fp32", "diloco-4bit": "DiLoCo, 4-bit",
          "streaming": "Streaming DiLoCo, P=4, τ=2, 4-bit",
          "decoupled": "Decoupled DiLoCo (as Streaming; K=1, grace, 4-bit down; + a syncer host)"}
PUBLISHED = 20.0  # the seeds' "more than 20× faster than DDP over slow links"


def final_loss(history: pd.DataFrame) -> float:
    """A run's last held-out loss."""
    return float(history.val_loss.iloc[-1])


def targets(runs: list[dict], by: str = "gbit_per_s") -> dict:
    """{speed (or scenario): (target, simulated target)}: the worst final held-out loss among
    the runs there (every method, every repeat), measured or simulated (the loss that every
    curve, on either clock, reaches: measured ÷ simulated then always compares the same loss),
    and among the simulated runs alone (the clock's own world, for its speed-ups)."""
    out = {}
    for key in dict.fromkeys(r[by] for r in runs):
        here = [r for r in runs if r[by] == key]
        sim = max(final_loss(r["simulated"]) for r in here)
        out[key] = (max(sim, *(final_loss(r["measured"]) for r in here)), sim)
    return out


def cells(runs: list[dict], by: str = "gbit_per_s") -> pd.DataFrame:
    """One row per (`by`, method), in the order the runs came: the target, the measured seconds
    to it over the repeats (`s`: the median; `s_min`, `s_max`), the simulated clock's seconds to
    the same loss (`sim_s`, the median of the simulated runs, which equal each other for the
    lock-step methods) and measured ÷ simulated;
    `sim_own_s`, the clock's seconds to its own target (the worst of its own final losses: its
    speed-ups are its own world's); and each extra scalar's mean over the repeats."""
    goal = targets(runs, by)
    rows = []
    for key, method in dict.fromkeys((r[by], r["method"]) for r in runs):
        here = [r for r in runs if r[by] == key and r["method"] == method]
        target, sim_target = goal[key]
        s = [time_to(r["measured"], target, "time_s") for r in here]
        sim = [time_to(r["simulated"], target, "time_s") for r in here]
        own = [time_to(r["simulated"], sim_target, "time_s") for r in here]
        row = {by: key, "method": method, "how": here[0]["how"], "repeats": len(here),
               "target_loss": target, "sim_target_loss": sim_target,
               "s": float(np.median(s)), "s_min": float(np.min(s)), "s_max": float(np.max(s)),
               "sim_s": float(np.median(sim)), "sim_own_s": float(np.median(own)),
               "final_loss": max(final_loss(r["measured"]) for r in here),
               "sim_final_loss": max(final_loss(r["simulated"]) for r in here)}
        row["measured_over_sim"] = row["s"] / row["sim_s"]
        if "lockstep" in here[0]:  # the decoupling rows: the lock-step method on the clock
            row["lockstep_sim_s"] = time_to(here[0]["lockstep"], target, "time_s")
        extra = {k for r in here for k, v in r.items() if np.isscalar(v) and k not in row
                 and k not in ("repeat", "how", by, "method") and not isinstance(v, str)}
        for k in sorted(extra):
            row[k] = float(np.mean([r.get(k, np.nan) for r in here]))
        rows.append(row)
    return pd.DataFrame(rows)


def speedups(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each row's speed-up over DDP (fp32) at its speed: `speedup` (medians),
    `speedup_min` (DDP's fastest repeat over the row's slowest), `speedup_max` (the other
    way round), `sim_speedup` (the simulated clock's, each run to the clock's own target)."""
    out = table.copy()
    for col in ("speedup", "speedup_min", "speedup_max", "sim_speedup"):
        out[col] = np.nan
    for _, rows in out.groupby("gbit_per_s", sort=False):
        ddp = rows[rows.method == "ddp"]
        if ddp.empty:
            continue
        d = ddp.iloc[0]
        out.loc[rows.index, "speedup"] = d.s / rows.s
        out.loc[rows.index, "speedup_min"] = d.s_min / rows.s_max
        out.loc[rows.index, "speedup_max"] = d.s_max / rows.s_min
        out.loc[rows.index, "sim_speedup"] = d.sim_own_s / rows.sim_own_s
    return out


def decomposition(table: pd.DataFrame) -> pd.DataFrame:
    """Per speed, Decoupled DiLoCo's speed-up over DDP and its two factors, measured and
    simulated: `cut` = DDP ÷ Streaming DiLoCo (what fewer, smaller, overlapped exchanges buy in
    lock-step), `decoupling` = Streaming ÷ Decoupled (what letting the learners run free buys on
    top), `total` = DDP ÷ Decoupled = cut × decoupling; beside them DiLoCo's (fp32) and DiLoCo's
    4-bit speed-ups over DDP (the cut of H alone, and of H with 4 bits)."""
    rows = []
    for gbit, t in table.groupby("gbit_per_s", sort=False):
        s = t.set_index("method")
        row = {"gbit_per_s": gbit}
        for clock, col in (("", "s"), ("sim_", "sim_own_s")):
            x = {m: float(s[col][m]) if m in s.index else np.nan for m in METHODS}
            row[f"{clock}diloco"] = x["ddp"] / x["diloco"]
            row[f"{clock}diloco_4bit"] = x["ddp"] / x["diloco-4bit"]
            row[f"{clock}cut"] = x["ddp"] / x["streaming"]
            row[f"{clock}decoupling"] = x["streaming"] / x["decoupled"]
            row[f"{clock}total"] = x["ddp"] / x["decoupled"]
        rows.append(row)
    return pd.DataFrame(rows)


def result_rows(table: pd.DataFrame, decoupling: pd.DataFrame | None = None) -> list[dict]:
    """The results table's rows: per speed, each method's measured speed-up over DDP to the
    same loss ("published 20" only beside Decoupled DiLoCo's at the slowest link), Decoupled's
    simulated one, the two factors of Decoupled's (measured and simulated), and a learner's and
    the syncer's host's bytes on the wire ÷ (booked + control); with `decoupling` (the
    decoupling rows' table) each method's measured ÷ simulated time to the target and goodput."""
    H = f"H={int(table.inner_steps.iloc[0])}, " if "inner_steps" in table else ""
    config = (f"{int(table.learners.iloc[0])} learner hosts on the testbed (Decoupled: + the "
              f"syncer's), default model, {int(table.steps.iloc[0])} steps, same tokens; {H}"
              "P=4, tau=2, 4-bit where the method has bits; compilation and evaluations left out")
    slowest = table.gbit_per_s.min()
    rows = []
    for r in speedups(table).to_dict("records"):
        at = f"@{r['gbit_per_s'] * 1e3:g} Mbit/s"
        if r["method"] == "ddp":
            continue
        dec = r["method"] == "decoupled"
        rows.append(dict(experiment="versus", method=f"{r['method']} vs ddp", config=config,
                         metric=f"wall-clock speed-up over DDP to the same loss, measured {at}",
                         value=float(r["speedup"]),
                         published=PUBLISHED if dec and r["gbit_per_s"] == slowest else None))
        if dec:
            rows.append(dict(experiment="versus", method="decoupled vs ddp", config=config,
                             metric=f"wall-clock speed-up over DDP to the same loss, simulated "
                                    f"{at}", value=float(r["sim_speedup"])))
            rows += _wire_rows(r, config, at)
    for r in decomposition(table).to_dict("records"):
        at = f"@{r['gbit_per_s'] * 1e3:g} Mbit/s"
        for key, what in (("cut", "the communication cut (DDP / Streaming)"),
                          ("decoupling", "the decoupling (Streaming / Decoupled)")):
            for clock, prefix in (("measured", ""), ("simulated", "sim_")):
                rows.append(dict(experiment="versus", method="decoupled vs ddp", config=config,
                                 metric=f"speed-up factor from {what}, {clock} {at}",
                                 value=float(r[prefix + key])))
    for r in ([] if decoupling is None else decoupling.to_dict("records")):
        for what, key in (("time to the target", "s"), ("goodput", "goodput")):
            rows.append(dict(experiment="versus", method=f"{r['method']} ({r['scenario']})",
                             config=config + "; 10 Mbit/s, on actors",
                             metric=f"measured / simulated {what}",
                             value=float(r[key] / r[f"sim_{key}"])))
    return rows


def ratio(row, what: str):
    """Bytes on the wire ÷ (booked + control) of `what` ("up", "down", "syncer_up", ...) in a
    table row (or, column by column, in the whole table)."""
    return row[f"{what}_wire"] / (row[f"{what}_booked"] + row[f"{what}_control"])


def _wire_rows(r: dict, config: str, at: str) -> list[dict]:
    rows = []
    for host, prefix in (("a learner host's", ""), ("the syncer's host's", "syncer_")):
        for way in ("up", "down"):
            if np.isfinite(r.get(f"{prefix}{way}_control", np.nan)):
                rows.append(dict(experiment="versus", method="decoupled vs ddp", config=config,
                                 metric=f"{host} bytes on the wire / booked with the control "
                                        f"traffic, {way} {at}",
                                 value=float(ratio(r, prefix + way))))
    return rows


def markdown(table: pd.DataFrame) -> str:
    """`table` (`cells`, one row per speed and method) as the two markdown tables docs/systems.md
    shows (a test holds the two together): every cell, then each speed's target and the
    factors of Decoupled DiLoCo's speed-up."""
    t = speedups(table)
    lines = ["| link per host | method | how | s to the target, median (min–max) | clock | "
             "measured ÷ clock | speed-up over DDP (min–max) | clock | wire ÷ (booked + "
             "control), a learner's / the syncer's host, up · down |",
             "|---:|:---|:---|---:|---:|---:|---:|---:|:---|"]
    for r in t.to_dict("records"):
        wire = "–"
        if np.isfinite(r.get("up_control", np.nan)):
            wire = " / ".join(" · ".join(f"{ratio(r, at + w):.2f}" for w in ("up", "down"))
                              for at in ("", "syncer_"))
        lines.append(
            f"| {r['gbit_per_s'] * 1e3:g} Mbit/s | {LABELS.get(r['method'], r['method'])} | "
            f"{r['how']} | {r['s']:.3g} ({r['s_min']:.3g}–{r['s_max']:.3g}) | {r['sim_s']:.3g} | "
            f"{r['measured_over_sim']:.2f} | **{r['speedup']:.2f}×** ({r['speedup_min']:.2f}–"
            f"{r['speedup_max']:.2f}) | {r['sim_speedup']:.2f}× | {wire} |")
    lines += ["", "| link per host | target loss, measured / clock | DiLoCo (fp32) | DiLoCo "
              "(4-bit) | the cut: Streaming over DDP | the decoupling: Decoupled over "
              "Streaming | Decoupled over DDP |", "|---:|---:|---:|---:|---:|---:|---:|"]
    goal = t.groupby("gbit_per_s", sort=False)[["target_loss", "sim_target_loss"]].first()
    for r in decomposition(t).to_dict("records"):
        g = goal.loc[r["gbit_per_s"]]
        cell = {k: f"{r[k]:.2f}× ({r['sim_' + k]:.2f}×)"
                for k in ("diloco", "diloco_4bit", "cut", "decoupling", "total")}
        lines.append(f"| {r['gbit_per_s'] * 1e3:g} Mbit/s | {g.target_loss:.3f} / "
                     f"{g.sim_target_loss:.3f} | {cell['diloco']} | {cell['diloco_4bit']} | "
                     f"{cell['cut']} | {cell['decoupling']} | **{cell['total']}** |")
    return "\n".join(lines)


def decoupling_markdown(table: pd.DataFrame) -> str:
    """The decoupling rows (`cells(runs, by="scenario")`) as a markdown table (with a killed
    learner, the longest wait of its replacement's first step after the window's end)."""
    lines = ["| scenario | method (on actors) | target loss, measured / clock | s to it, measured "
             "/ clock | measured ÷ clock | goodput, measured / clock | lock-step on the clock, "
             "s to the target | killed: from the window's end to the spare's first step, s |",
             "|:---|:---|---:|---:|---:|---:|---:|---:|"]
    for r in table.to_dict("records"):
        lines.append(
            f"| {r['scenario']} | {r['method']} | {r['target_loss']:.3f} / "
            f"{r['sim_target_loss']:.3f} | {r['s']:.3g} / {r['sim_s']:.3g} | "
            f"{r['measured_over_sim']:.2f} | {r['goodput']:.2f} / {r['sim_goodput']:.2f} | "
            f"{_or_dash(r.get('lockstep_sim_s', np.nan))} | "
            f"{_or_dash(r.get('max_first_step_s', np.nan))} |")
    return "\n".join(lines)


def _or_dash(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else "–"
