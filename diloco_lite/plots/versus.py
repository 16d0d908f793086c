"""The figure of where the speed-up over slow links comes from (`actors.versus`, notebook 09):
each method's wall-clock speed-up over DDP (fp32) to the same loss against the link speed,
measured on the testbed (the median of the repeats, a bar from the slowest to the fastest)
beside the simulated clock's, with the seeds' 20× and "as fast as DDP" marked."""

from __future__ import annotations

import altair as alt
import pandas as pd

WIDTH = 460
ORDER = ["ddp-bf16", "diloco", "diloco-4bit", "streaming", "decoupled"]


def speedup_frame(table: pd.DataFrame) -> pd.DataFrame:
    """`versus.csv`'s rows (one per link speed and method, with `versus_table.speedups`' columns)
    as one row per (link speed, method, clock): Mbit/s, method, clock, speed-up, low, high
    (the measured range over the repeats; the clock's: its value)."""
    if "method" not in table:  # the table before issue 37: Decoupled against DDP alone
        table = table.assign(method="decoupled", speedup_min=table.speedup,
                             speedup_max=table.speedup)
    rows = []
    for r in table.to_dict("records"):
        if r["method"] == "ddp":
            continue
        base = {"Mbit/s": r["gbit_per_s"] * 1e3, "method": r["method"]}
        rows.append({**base, "clock": "measured", "speed-up": r["speedup"],
                     "low": r["speedup_min"], "high": r["speedup_max"]})
        rows.append({**base, "clock": "simulated", "speed-up": r["sim_speedup"],
                     "low": r["sim_speedup"], "high": r["sim_speedup"]})
    return pd.DataFrame(rows)


def speedup_chart(table: pd.DataFrame) -> alt.LayerChart:
    """Speed-up over DDP to the same loss (log) against the link speed (log, slow on the left),
    a line per method, measured (solid, with its min–max over the repeats) and simulated
    (dashed), with rules at 20× and 1×."""
    df = speedup_frame(table)
    x = alt.X("Mbit/s:Q", scale=alt.Scale(type="log"), title="link speed of each host (Mbit/s)")
    y = alt.Y("speed-up:Q", scale=alt.Scale(type="log"), title="speed-up over DDP, same loss")
    color = alt.Color("method:N", sort=ORDER, title=None,
                      legend=alt.Legend(orient="top-right"))
    dash = alt.StrokeDash("clock:N", title=None, legend=alt.Legend(orient="bottom-right"))
    lines = alt.Chart(df).mark_line(point=alt.OverlayMarkDef(size=50)).encode(
        x=x, y=y, color=color, strokeDash=dash,
        tooltip=["Mbit/s", "method", "clock", alt.Tooltip("speed-up:Q", format=".2f"),
                 alt.Tooltip("low:Q", format=".2f"), alt.Tooltip("high:Q", format=".2f")])
    bars = alt.Chart(df[df.clock == "measured"]).mark_rule(strokeWidth=2).encode(
        x=x, y=alt.Y("low:Q", scale=alt.Scale(type="log")), y2="high:Q", color=color)
    marks = pd.DataFrame({"speed-up": [20.0, 1.0],
                          "label": ["the seeds' 20×", "as fast as DDP"]})
    rules = alt.Chart(marks).mark_rule(strokeDash=[4, 4], color="#777").encode(y="speed-up:Q")
    text = alt.Chart(marks).mark_text(align="left", dx=4, dy=-6, color="#555").encode(
        y="speed-up:Q", text="label:N", x=alt.value(0))
    return (rules + text + bars + lines).properties(
        width=WIDTH, height=300,
        title="Over slow links: every method against DDP (Decoupled: + a syncer host)")
