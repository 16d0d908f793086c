"""Figures of the real-link measurements (`diloco_lite.distributed.measure`).

Each builder takes `measure()`'s table and returns an Altair chart; save it with
`diloco_lite.plots.save(chart, name)`. `distributed.measure.reproduce_job` writes
`figures/links_time` and `figures/links_bytes`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import method_colors, method_label


def time_chart(table: pd.DataFrame) -> alt.LayerChart:
    """Seconds per step against the link rate (log x, Mbit/s): measured as solid lines with
    dots, the simulated clock's prediction for the same `Cluster` dashed, one colour per method.
    Columns: gbit_per_s, method, wall_s_per_step, sim_s_per_step."""
    labels, colors = method_colors(table.method)
    df = table.assign(mbit=table.gbit_per_s * 1e3, method=table.method.map(method_label))
    long = pd.concat([
        df.assign(clock="measured", s_per_step=df.wall_s_per_step),
        df.assign(clock="simulated", s_per_step=df.sim_s_per_step)])
    x = alt.X("mbit:Q", title="link rate per host (Mbit/s)", scale=alt.Scale(type="log"))
    y = alt.Y("s_per_step:Q", title="seconds per step", scale=alt.Scale(type="log"))
    color = alt.Color("method:N", title="method", scale=alt.Scale(domain=labels, range=colors))
    dash = alt.StrokeDash("clock:N", title="clock", scale=alt.Scale(
        domain=["measured", "simulated"], range=[[1, 0], [6, 4]]))
    tooltip = ["method", "clock", alt.Tooltip("mbit:Q", title="Mbit/s", format="g"),
               alt.Tooltip("s_per_step:Q", format=".3f")]
    lines = alt.Chart(long).mark_line(strokeWidth=2).encode(x=x, y=y, color=color,
                                                             strokeDash=dash)
    dots = alt.Chart(long).mark_point(filled=True, size=45, opacity=1).encode(
        x=x, y=y, color=color, shape=alt.Shape("clock:N", legend=None), tooltip=tooltip)
    return alt.layer(lines, dots).properties(
        width=420, height=280,
        title=alt.Title("Real links against the simulated clock",
                        subtitle="solid: measured on the testbed; dashed: the clock's "
                                 "prediction for the same cluster"))


def bytes_chart(table: pd.DataFrame) -> alt.Chart:
    """Bytes that left a host per run: the booking × the collective's factor (the model) beside
    what the interface counters measured, one pair of bars per method and link rate.
    Columns: gbit_per_s, method, wire_model, tx_per_host."""
    df = table.dropna(subset=["tx_per_host"])
    long = pd.concat([
        df.assign(what="booked × collective factor", mb=df.wire_model / 1e6),
        df.assign(what="measured on the wire", mb=df.tx_per_host / 1e6)])
    long = long.assign(method=long.method.map(method_label),
                       link=[f"{g * 1e3:g} Mbit/s" for g in long.gbit_per_s])
    order = [f"{g * 1e3:g} Mbit/s" for g in sorted(df.gbit_per_s.unique())]
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("link:N", title="link rate per host", sort=order, axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("what:N"),
        y=alt.Y("mb:Q", title="MB sent per host, whole run"),
        color=alt.Color("what:N", title=None, scale=alt.Scale(range=["#8C8C8C", "#4C72B0"]),
                        legend=alt.Legend(orient="bottom")),
        column=alt.Column("method:N", title=None),
        tooltip=["method", "link", "what", alt.Tooltip("mb:Q", title="MB", format=".3f")],
    ).properties(width=200, height=220, title="Bytes on the wire against the booking")
