"""The figure of Decoupled DiLoCo against DDP over the testbed's slow links (`actors.versus`,
notebook 08): the wall-clock speed-up to the same loss against the link speed, measured beside
the simulated clock's, with the seeds' 20× and "as fast as DDP" marked."""

from __future__ import annotations

import altair as alt
import pandas as pd

WIDTH = 420


def speedup_frame(table: pd.DataFrame) -> pd.DataFrame:
    """`versus.csv`'s rows as one row per (link speed, clock): Mbit/s, clock, speed-up."""
    rows = []
    for r in table.to_dict("records"):
        for clock, key in (("measured on the testbed", "speedup"),
                           ("simulated clock", "sim_speedup")):
            rows.append({"Mbit/s": r["gbit_per_s"] * 1e3, "clock": clock, "speed-up": r[key]})
    return pd.DataFrame(rows)


def speedup_chart(table: pd.DataFrame) -> alt.LayerChart:
    """Speed-up over DDP to the same loss (log) against the link speed (log, slow on the left),
    measured and simulated, with rules at 20× and 1×."""
    df = speedup_frame(table)
    x = alt.X("Mbit/s:Q", scale=alt.Scale(type="log"), title="link speed of each host (Mbit/s)")
    y = alt.Y("speed-up:Q", scale=alt.Scale(type="log"),
              title="Decoupled DiLoCo's speed-up over DDP, same loss")
    color = alt.Color("clock:N", title=None, legend=alt.Legend(orient="bottom-left"))
    lines = alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=70)).encode(
        x=x, y=y, color=color,
        tooltip=["Mbit/s", "clock", alt.Tooltip("speed-up:Q", format=".2f")])
    marks = pd.DataFrame({"speed-up": [20.0, 1.0],
                          "label": ["the seeds' 20×", "as fast as DDP"]})
    rules = alt.Chart(marks).mark_rule(strokeDash=[4, 4], color="#777").encode(y="speed-up:Q")
    text = alt.Chart(marks).mark_text(align="right", dx=-4, dy=-6, color="#555").encode(
        y="speed-up:Q", text="label:N", x=alt.value(WIDTH))
    return (rules + text + lines).properties(
        width=WIDTH, height=260,
        title="Over slow links: Decoupled DiLoCo against DDP (4 hosts + the syncer's)")
