"""Figures of Decoupled DiLoCo's experiments (`experiments.decoupled`, notebook 04).

`loss_vs_time` puts held-out loss on the simulated clock (where Decoupled DiLoCo's advantage
lives); `goodput_bars` sets the goodput measured from training runs beside notebook 06's
simulator; `ablations` shows each ablation's accuracy change next to the paper's.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .diloco import colour


def loss_vs_time(histories: dict, title: str, target: float | None = None) -> alt.Chart:
    """Held-out loss against simulated time, one line per run; a dashed rule at `target`."""
    df = pd.concat([h[["sim_time_s", "tokens", "val_loss"]].assign(method=k)
                    for k, h in histories.items()], ignore_index=True)
    base = alt.Chart(df).mark_line(point=True, strokeWidth=2).encode(
        x=alt.X("sim_time_s:Q", title="simulated time (s)"),
        y=alt.Y("val_loss:Q", title="held-out loss (nats/char)", scale=alt.Scale(zero=False)),
        color=colour(histories),
        tooltip=["method", alt.Tooltip("sim_time_s:Q", format=",.0f"),
                 alt.Tooltip("tokens:Q", format=",.0f"), alt.Tooltip("val_loss:Q", format=".3f")])
    chart = base
    if target is not None:
        rule = alt.Chart(pd.DataFrame({"target": [target]})).mark_rule(
            strokeDash=[5, 4], color="#666").encode(y="target:Q")
        label = alt.Chart(pd.DataFrame({"target": [target], "text": [f"target {target:.3f}"]}))
        chart = base + rule + label.mark_text(align="left", dy=-6, x=4, color="#444").encode(
            y="target:Q", text="text:N")
    return chart.properties(width=480, height=280, title=title)


def goodput_bars(table: pd.DataFrame) -> alt.Chart:
    """Goodput per method: measured from the training run (bar), the part of the cluster's
    steps lost to the overlap by design (light bar after it: the steps between a merged answer
    and applying its result, which the arriving fragment overwrites), and the simulator's
    closed form at the same failure rate (tick), which models failures only.
    Columns: method, run, overlap, simulator."""
    order = list(table.method)
    data = table.assign(with_overlap=table.run + table.overlap)
    y = alt.Y("method:N", sort=order, title=None)
    x = alt.X("run:Q", title="goodput", axis=alt.Axis(format="%"), scale=alt.Scale(
        domain=[0, 1]))
    bars = alt.Chart(data).mark_bar(opacity=0.85).encode(
        y=y, x=x, color=colour(order).legend(None),
        tooltip=["method", alt.Tooltip("run:Q", format=".1%", title="from the run")])
    overlap = alt.Chart(data[data.overlap > 0]).mark_bar(opacity=0.3).encode(
        y=y, x="run:Q", x2="with_overlap:Q", color=colour(order).legend(None),
        tooltip=["method", alt.Tooltip("overlap:Q", format=".1%", title="lost to the overlap")])
    ticks = alt.Chart(data).mark_tick(thickness=3, size=22, color="black").encode(
        y=y, x="simulator:Q",
        tooltip=["method", alt.Tooltip("simulator:Q", format=".1%", title="simulator")])
    text = alt.Chart(data).mark_text(align="right", dx=-4, color="white", fontWeight="bold").encode(
        y=y, x="run:Q", text=alt.Text("run:Q", format=".0%"))
    return (bars + overlap + ticks + text).properties(
        width=420, height=36 * len(order),
        title=["Goodput: measured from the runs (bars; light: lost to the overlap)",
               "and notebook 06's simulator (ticks)"])


def ablations(table: pd.DataFrame) -> alt.Chart:
    """Accuracy change from each ablation's baseline, in points: ours (dot) and the paper's
    (hollow diamond, benchmark average points) where it published one."""
    order = list(table.method)
    y = alt.Y("method:N", sort=order, title=None)
    ours = alt.Chart(table).mark_point(filled=True, size=90).encode(
        y=y, x=alt.X("delta:Q", title="accuracy change vs its baseline (points)"),
        color=alt.Color("ablation:N", title=None),
        tooltip=["method", alt.Tooltip("val_accuracy:Q", format=".2%"),
                 alt.Tooltip("delta:Q", format="+.2f")])
    paper = alt.Chart(table.dropna(subset=["published_delta"])).mark_point(
        shape="diamond", size=110, filled=False, strokeWidth=2, color="black").encode(
        y=y, x="published_delta:Q",
        tooltip=["method", alt.Tooltip("published_delta:Q", format="+.1f", title="paper")])
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(color="#999").encode(x="x:Q")
    return (zero + ours + paper).properties(
        width=420, height=24 * len(order),
        title="Ablations: ours (dots) and the paper's (diamonds)")


# what -> (legend label, colour, shape, offset within its lane)
TIMELINE = {
    "step": ("learner ends a step", "#BBBBBB", "", 0.0),  # a grey tick, no legend entry
    "ask": ("syncer asks for fragment p", "#8C8C8C", "triangle-down", -0.22),
    "answer": ("learner answers (Δ leaves)", "#4C72B0", "circle", -0.22),
    "close": ("syncer closes and merges", "#C44E52", "diamond", 0.0),
    "publish": ("new Θ_p reaches the learners", "#8C2D2D", "square", 0.22),
    "apply": ("learner applies Θ_p", "#55A868", "square", 0.22),
    "rejoin": ("learner rejoins", "#8172B3", "triangle-right", 0.0),
}


def timeline(log: list, title: str = "Decoupled DiLoCo on the simulated clock") -> alt.LayerChart:
    """The events of a reference run (`reference.decoupled(config, log=log)`): one lane for the
    syncer and one per learner, a shaded bar while a learner is down, the fragment as a label."""
    rows, down, end = [], [], max(t for t, *_ in log)
    for t, what, m, p in log:
        if what == "fail":
            back = min([u for u, w, n, _ in log if w == "rejoin" and n == m and u >= t] + [end])
            down.append(dict(lane=f"learner {m}", start=t, stop=back))
        elif what in TIMELINE:
            lane = "syncer" if what in ("ask", "close", "publish") else f"learner {m}"
            rows.append(dict(time_s=t, lane=lane, what=TIMELINE[what][0], kind=what,
                             fragment="" if p is None else f"p{p}"))
    df = pd.DataFrame(rows)
    lanes = ["syncer"] + sorted({r["lane"] for r in rows} - {"syncer"}, key=lambda s: int(s[8:]))
    df["y"] = df.lane.map(lanes.index) + df.kind.map(lambda k: TIMELINE[k][3])
    y = alt.Y("y:Q", title=None, scale=alt.Scale(domain=[len(lanes) - 0.5, -0.5], nice=False,
                                                 zero=False),
              axis=alt.Axis(values=list(range(len(lanes))), grid=False, ticks=False,
                            labelExpr="[" + ", ".join(f"'{x}'" for x in lanes) + "][datum.value]"))
    x = alt.X("time_s:Q", title="simulated seconds", scale=alt.Scale(domain=[0, end], nice=False))
    kinds = [v for k, v in TIMELINE.items() if k != "step"]
    labels = [v[0] for v in kinds]
    steps = alt.Chart(df[df.kind == "step"]).mark_tick(color="#BBBBBB", thickness=1.5,
                                                        size=14).encode(x=x, y=y)
    marks = alt.Chart(df[df.kind != "step"]).mark_point(filled=True, size=60, opacity=0.9).encode(
        x=x, y=y, tooltip=["lane", "kind", "fragment", alt.Tooltip("time_s:Q", format=".2f")],
        color=alt.Color("what:N", sort=labels, title=None, legend=alt.Legend(orient="bottom",
                        columns=3), scale=alt.Scale(domain=labels, range=[v[1] for v in kinds])),
        shape=alt.Shape("what:N", sort=labels, scale=alt.Scale(domain=labels,
                                                               range=[v[2] for v in kinds])))
    text = alt.Chart(df[df.kind.isin(["ask", "publish"])]).mark_text(
        dy=-9, fontSize=9, color="#555").encode(x=x, y=y, text="fragment:N")
    layers = [steps, marks, text]
    if down:
        bars = pd.DataFrame(down).assign(y=lambda d: d.lane.map(lanes.index) - 0.3,
                                         y2=lambda d: d.lane.map(lanes.index) + 0.3)
        layers.insert(0, alt.Chart(bars).mark_rect(color="#F2C4C4").encode(
            x=alt.X("start:Q"), x2="stop:Q", y=y, y2="y2:Q"))
    return alt.layer(*layers).properties(width=760, height=46 * len(lanes), title=title)
