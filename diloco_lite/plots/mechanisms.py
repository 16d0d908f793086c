"""Pictures of the lock-step mechanisms, drawn from what the code computes, not by hand.

- `ring_allreduce` runs a ring all-reduce chunk by chunk on real numpy arrays (a reduce-scatter,
  then an all-gather) and `ring_chart` draws every step of it (notebook 00, section 7);
- `loops_chart` draws DiLoCo's inner and outer loops from a run's plan (`RunResult.plan`: each
  worker's step times and the sync events the run replayed; notebook 02);
- `schedule_table` / `schedule_chart`: which fragment is sent after which step, arriving τ
  steps later and mixed in with α, from the library's one `clock.Schedule` (notebook 03).

Each data function returns what its chart draws, so tests/test_mechanisms.py checks the data
against plain loops. Save a chart with `plots.save(chart, "mechanism_...")`.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from . import PALETTE

SYNC = "#C44E52"  # a sync, in every picture
TICK = "#9A9A9A"  # an inner step


def _lanes_axis(lanes: list[str]) -> alt.Axis:
    """A quantitative y axis that names lanes 0, 1, ... (lane i at y = i)."""
    names = "[" + ", ".join(f"'{x}'" for x in lanes) + "]"
    return alt.Axis(values=list(range(len(lanes))), grid=False, ticks=False, title=None,
                    labelExpr=f"{names}[datum.value]", labelFontSize=12)


def _lanes_scale(n: int) -> alt.Scale:
    return alt.Scale(domain=[n - 0.5, -0.5], nice=False, zero=False)


# ---- 1. ring all-reduce ---------------------------------------------------------------------
def ring_allreduce(arrays) -> tuple[list[np.ndarray], pd.DataFrame, list[list[np.ndarray]]]:
    """All-reduce (sum) the N arrays `arrays[d]` of N devices on a ring, chunk by chunk.

    Each array is cut into N chunks. Reduce-scatter, steps 1 … N−1: device d sends chunk
    (d − s + 1) mod N to device d + 1, which adds it to its own; after it, device d holds the
    whole sum of chunk (d + 1) mod N. All-gather, steps N … 2N−2: device d sends the chunk it
    last completed to d + 1, which keeps it. Returns (each device's result, the sends: step,
    phase, src, dst, chunk, nbytes; the chunks each device holds after each step, step 0 the
    start)."""
    n = len(arrays)
    held = [np.array_split(np.asarray(a).copy(), n) for a in arrays]  # held[d][c]
    states, sends = [[[c.copy() for c in h] for h in held]], []
    for s in range(2 * (n - 1)):
        reduce = s < n - 1
        msgs = [(d, (d + 1) % n, (d - s) % n if reduce else (d + 1 - (s - n + 1)) % n)
                for d in range(n)]
        payload = [held[src][c].copy() for src, _, c in msgs]  # every device sends at once
        for (src, dst, c), x in zip(msgs, payload, strict=True):
            held[dst][c] = held[dst][c] + x if reduce else x
            sends.append(dict(step=s + 1, phase="reduce-scatter" if reduce else "all-gather",
                              src=src, dst=dst, chunk=c, nbytes=int(x.nbytes)))
        states.append([[c.copy() for c in h] for h in held])
    return [np.concatenate(h) for h in held], pd.DataFrame(sends), states


def ring_chart(devices: int = 4, values: int = 1_000_000) -> alt.VConcatChart:
    """Every step of a ring all-reduce of `values` float32 on `devices` devices. Device d starts
    with 10^(N−1−d) in every value, so a chunk's digits say whose values it holds (1111: all)."""
    n = devices
    arrays = [np.full(values, 10.0 ** (n - 1 - d), np.float32) for d in range(n)]
    result, sends, states = ring_allreduce(arrays)
    assert all(np.array_equal(r, sum(arrays)) for r in result)
    size = arrays[0].nbytes
    panels = []
    for k, state in enumerate(states):
        got = sends[sends.step == k]
        rows = []
        for d in range(n):
            for c in range(n):
                v = int(state[d][c][0])
                hit = got[(got.dst == d) & (got.chunk == c)]
                rows.append(dict(device=f"device {d}", chunk=c, value=f"{v:0{n}d}",
                                 held=sum(map(int, str(v))), new=len(hit) > 0,
                                 note=(f"received from device {int(hit.src.iloc[0])}: "
                                       f"{int(hit.nbytes.iloc[0]):,} B") if len(hit) else ""))
        df = pd.DataFrame(rows)
        sent = int(got.loc[got.src == 0, "nbytes"].sum())
        total = int(sends.loc[(sends.src == 0) & (sends.step <= k), "nbytes"].sum())
        if k == 0:
            title = ["start", f"each device holds {size / 1e6:g} MB"]
        else:
            phase, i = (("reduce-scatter", k) if k < n else ("all-gather", k - n + 1))
            title = [f"{phase} {i} of {n - 1}",
                     f"each device sends {sent / 1e6:g} MB ({total / 1e6:g} MB so far)"]
        x = alt.X("chunk:O", title="chunk", axis=alt.Axis(labelAngle=0, grid=False))
        y = alt.Y("device:N", title=None, sort=[f"device {d}" for d in range(n)],
                  axis=alt.Axis(grid=False))
        base = alt.Chart(df).encode(x=x, y=y, tooltip=["device", "chunk", "value", "note"])
        cells = base.mark_rect(stroke="white", strokeWidth=1).encode(
            color=alt.Color("held:Q", title="devices summed in", legend=alt.Legend(
                values=list(range(1, n + 1)), format="d", orient="bottom")
                if k == 0 else None, scale=alt.Scale(domain=[1, n], scheme="blues")))
        ring = base.transform_filter("datum.new").mark_rect(
            fill=None, stroke="black", strokeWidth=2.5)
        text = base.mark_text(fontSize=11).encode(
            text="value:N", color=alt.condition(f"datum.held >= {n - 1}", alt.value("white"),
                                                alt.value("black")))
        panels.append(alt.layer(cells, ring, text).properties(
            width=42 * n, height=30 * n, title=alt.Title(title, fontSize=12,
                                                        subtitleFontSize=11)))
    top = alt.hconcat(*panels[:n])
    bottom = alt.hconcat(alt.Chart(pd.DataFrame({"x": []})).mark_text().properties(
        width=42 * n, height=30 * n), *panels[n:])  # the all-gather under the reduce-scatter
    per_device = sends.loc[sends.src == 0, "nbytes"].sum()
    return alt.vconcat(top, bottom).properties(title=alt.Title(
        f"Ring all-reduce of a {size / 1e6:g} MB array on {n} devices, step by step",
        subtitle=[f"Device d sends one chunk (1/{n} of the array) to device d + 1 at every "
                  f"step; outlined: the chunk a device just received.",
                  "A cell's digits say whose values it holds (device 0 is the first digit): "
                  f"{'1' * n} is the sum. Top: reduce-scatter (add it in); bottom: all-gather "
                  "(keep it).",
                  f"Per device: {2 * (n - 1)} sends of {size / n / 1e6:g} MB = 2(N−1)/N × "
                  f"{size / 1e6:g} MB = {per_device / 1e6:g} MB."]))


# ---- 2. DiLoCo's two loops ------------------------------------------------------------------
def loops_table(plan) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps: worker, time_s, step; syncs: time_s, kind, fragment, workers, flush: the
    end-of-run plain average, no outer step) from a run's plan."""
    steps = pd.DataFrame([dict(worker=m, time_s=float(t), step=k + 1)
                          for m, times in enumerate(plan.step_time) for k, t in enumerate(times)])
    syncs = pd.DataFrame([dict(time_s=float(e.time_s), kind=e.kind, fragment=e.fragment,
                               workers=int(np.sum(e.mask)) if e.mask is not None else plan.learners,
                               flush=bool(e.flush))
                          for b in plan.blocks for e in b.events
                          if e.kind in ("send", "close", "arrive")])
    return steps, syncs


def loops_chart(result) -> alt.LayerChart:
    """DiLoCo's inner and outer loops on the simulated clock of a run (`dl.train`'s result):
    one lane per worker with a tick per inner step, a lane for θ with each outer step."""
    steps, syncs = loops_table(result.plan)
    M, H = result.plan.learners, result.config.algorithm.inner_steps
    lanes = ["θ (outer)"] + [f"worker {m}" for m in range(M)]
    y, end = alt.Y("y:Q", scale=_lanes_scale(len(lanes)), axis=_lanes_axis(lanes)), \
        float(steps.time_s.max())
    x = alt.X("time_s:Q", title="simulated seconds (one inner step = 1 s)",
              scale=alt.Scale(domain=[0, end + 0.5], nice=False))
    steps = steps.assign(y=steps.worker + 1)
    closes = syncs[syncs.kind == "close"].reset_index(drop=True)
    closes = closes.assign(y=0, label=["final average" if f else f"outer step {i + 1}"
                                       for i, f in zip(closes.index, closes.flush, strict=True)])
    sends = syncs[syncs.kind == "send"].merge(pd.DataFrame({"worker": range(M)}), how="cross")
    sends = sends.assign(y=sends.worker + 1)
    ticks = alt.Chart(steps).mark_tick(color=TICK, thickness=1.5, size=14).encode(
        x=x, y=y, tooltip=["worker", "step", alt.Tooltip("time_s:Q", title="ends at (s)")])
    band = alt.Chart(closes).mark_rule(color=SYNC, strokeWidth=2, opacity=0.5).encode(x=x)
    delta = alt.Chart(sends).mark_point(shape="triangle-up", filled=True, size=60,
                                        color=SYNC).encode(
        x=x, y=y, tooltip=["worker", alt.Tooltip("time_s:Q", title="Δ_m sent at (s)")])
    outer = alt.Chart(closes).mark_point(shape="diamond", filled=True, size=140,
                                         color=PALETTE["diloco"], opacity=1).encode(
        x=x, y=y, tooltip=["label", alt.Tooltip("time_s:Q", title="at (s)"),
                           alt.Tooltip("workers:Q", title="Δ_m averaged")])
    label = alt.Chart(closes).mark_text(align="right", dx=-10, fontSize=11).encode(
        x=x, y=y, text="label:N")
    first = float(closes.time_s.iloc[0])
    gaps = pd.DataFrame({"mid": [(first + 1) / 2], "y": [0.5],
                         "text": [f"← H = {H} inner steps, alone →"]})
    between = alt.Chart(gaps).mark_text(fontSize=11, color="#444").encode(
        x=alt.X("mid:Q"), y=y, text="text:N")
    return alt.layer(band, ticks, delta, outer, label, between).properties(
        width=720, height=32 * len(lanes) + 16, title=alt.Title(
            f"DiLoCo's two loops: {M} workers, a sync every H = {H} steps (dl.train's plan)",
            subtitle=["Grey ticks: inner AdamW steps, each worker alone on its own data. Red: "
                      "the sync: each worker's Δ_m = θ − θ_m leaves (triangles),",
                      "the Δ_m are all-gathered and averaged, the outer Nesterov step moves θ "
                      "(diamonds), and every worker restarts from the new θ."]))


# ---- 3. the fragment schedule ---------------------------------------------------------------
def schedule_table(algorithm, steps: int) -> pd.DataFrame:
    """Every send of a Streaming (or Decoupled) DiLoCo config's schedule up to `steps`:
    fragment, sent (after that step), arrives (after step sent + τ), from `clock.Schedule`."""
    from ..clock.schedule import Schedule

    s = Schedule.of(algorithm)
    return pd.DataFrame([dict(fragment=p, sent=t, arrives=t + s.overlap)
                         for p in range(s.fragments) for t in s.send_steps(p, steps)])


def schedule_chart(algorithm, steps: int, fragment_bytes=None) -> alt.LayerChart:
    """The fragment schedule: one lane per fragment, a dot when it is sent, a line while it is
    in flight (the workers keep training), a square when it is mixed in with α."""
    df = schedule_table(algorithm, steps)
    P, H, tau, alpha = (algorithm.fragments, algorithm.inner_steps, algorithm.overlap,
                        algorithm.mix)
    lanes = [f"p{p}" + (f" · {fragment_bytes[p] / 1e3:,.0f} kB" if fragment_bytes else "")
             for p in range(P)]
    df = df.assign(y=df.fragment, lane=df.fragment.map(lanes.__getitem__))
    end = int(df.arrives.max())
    y = alt.Y("y:Q", scale=_lanes_scale(P), axis=_lanes_axis(lanes))
    x = alt.X("sent:Q", title="inner step", scale=alt.Scale(domain=[0, end + 0.5], nice=False),
              axis=alt.Axis(values=list(range(0, end + 1)), grid=True, labelOverlap=False))
    tip = ["lane", alt.Tooltip("sent:Q", title="sent after step"),
           alt.Tooltip("arrives:Q", title="mixed in after step")]
    green = PALETTE["streaming_diloco"]
    flight = alt.Chart(df).mark_rule(strokeWidth=3, color=green, opacity=0.6).encode(
        x=x, x2="arrives:Q", y=y, tooltip=tip)
    sent = alt.Chart(df).mark_point(filled=True, size=90, opacity=1, color=SYNC).encode(
        x=x, y=y, tooltip=tip)
    mixed = alt.Chart(df).mark_point(shape="square", filled=True, size=90, opacity=1).encode(
        x=alt.X("arrives:Q"), y=y, color=alt.value(green), tooltip=tip)
    periods = pd.DataFrame({"t": list(range(H, end + 1, H))})
    period = periods.assign(text=[f"step {t}: period {i + 1} ends" for i, t in
                                  enumerate(periods.t)], y=-0.45)
    rules = alt.Chart(periods).mark_rule(strokeDash=[4, 3], color="#777").encode(x="t:Q")
    notes = alt.Chart(period).mark_text(align="right", dx=-4, fontSize=10, color="#555").encode(
        x="t:Q", y=y, text="text:N")
    return alt.layer(rules, notes, flight, sent, mixed).properties(
        width=640, height=44 * P + 20, title=alt.Title(
            f"The fragment schedule: P = {P}, H = {H}, τ = {tau}, α = {alpha:g} "
            "(clock.Schedule, the one dl.train uses)",
            subtitle=["Red dot: fragment p's Δ leaves after step (p + 1)·H/P (rounded down), "
                      "then every H steps;",
                      "at most one fragment leaves per step, so the peak per step is one "
                      "fragment, not the model.",
                      f"Line: in flight for τ = {tau} steps while the workers keep training; "
                      f"green square: the new Θ_p is mixed in,",
                      f"θ ← {alpha:g}·θ + {1 - alpha:g}·Θ_p, and becomes the base of the next "
                      "Δ."]))
