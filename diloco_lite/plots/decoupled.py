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
