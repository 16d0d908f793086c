"""Figures of the papers' protocol (`experiments.protocol`): the outer-lr grid on the tune plays,
and from scratch against a warm start (the scaling-law sweep: `plots.scaling`)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import PALETTE

_COLOUR = {"DDP": PALETTE["ddp"], "DiLoCo": PALETTE["diloco"],
           "Streaming DiLoCo": PALETTE["streaming_diloco"],
           "Decoupled DiLoCo": PALETTE["decoupled_diloco"]}


def _colour(methods, title="method") -> alt.Color:
    order = list(dict.fromkeys(methods))
    return alt.Color("method:N", title=title, sort=order, scale=alt.Scale(
        domain=order, range=[_COLOUR.get(m, "#8C8C8C") for m in order]))


def tuning(grid: pd.DataFrame) -> alt.Chart:
    """Final tune-plays loss against the outer learning rate, one line per method; the chosen
    lr (lowest loss) ringed. `grid`: `protocol.choose`'s table."""
    colour = _colour(grid.method)
    base = alt.Chart(grid).encode(
        x=alt.X("outer_lr:Q", title="outer learning rate (Nesterov, momentum 0.9)",
                scale=alt.Scale(zero=False, padding=20)),
        y=alt.Y("tune_loss:Q", title="tune-plays loss (nats/char)", scale=alt.Scale(zero=False)),
        color=colour,
        tooltip=["method", "outer_lr:Q", alt.Tooltip("tune_loss:Q", format=".4f"),
                 alt.Tooltip("tune_accuracy:Q", format=".2%")])
    lines = base.mark_line(point=True, strokeWidth=2)
    chosen = base.transform_filter("datum.chosen").mark_point(size=260, strokeWidth=2,
                                                               filled=False)
    return (lines + chosen).properties(
        width=420, height=260, title="Choosing the outer learning rate on the tune plays (ringed)")


def warm_start(table: pd.DataFrame) -> alt.Chart:
    """Test-plays accuracy per method, from scratch and after the shared DDP pre-training.
    `table`: `protocol.warm_table`."""
    df = table.assign(text=[f"{a:.1%}" for a in table.test_accuracy])
    order = list(dict.fromkeys(df.method))
    base = alt.Chart(df).encode(
        y=alt.Y("method:N", sort=order, title=None),
        x=alt.X("test_accuracy:Q", title="next-char accuracy on the test plays",
                axis=alt.Axis(format="%"), scale=alt.Scale(zero=False, padding=30)),
        color=alt.Color("regime:N", title=None, scale=alt.Scale(range=["#8C8C8C", "#DD8452"])),
        tooltip=["method", "regime", alt.Tooltip("test_accuracy:Q", format=".2%"),
                 alt.Tooltip("gap_points:Q", format="+.2f", title="vs DDP (points)")])
    dots = base.mark_point(filled=True, size=110, opacity=1)
    text = base.mark_text(align="left", dx=9, dy=-9, fontSize=10).encode(text="text:N")
    return (dots + text).properties(width=420, height=36 * len(order),
                                    title="From scratch vs a warm start, at equal tokens")
