"""Figures of the goodput chaos simulator (`diloco_lite.systems.goodput`, `.goodput_report`).

Each builder takes tidy data and returns an Altair chart; save it with
`diloco_lite.plots.save(chart, name)`. `systems.goodput_report.reproduce_job` writes
`figures/goodput_vs_chips`, `goodput_vs_learners`, `goodput_buckets` and `goodput_timeline`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import PALETTE, method_label, spread

BUCKET_COLORS = {
    "useful": "#55A868", "checkpoint": "#4C72B0", "lost": "#DD8452", "restart": "#C44E52",
    "rejoin": "#8172B3", "waiting": "#CCB974", "down": "#555555",
}
STATE_COLORS = {"up": "#55A868", "recovering": "#DD8452", "down": "#C44E52"}
# Decoupled variants in shades of the decoupled red, lighter for fewer learners.
_DECOUPLED_SHADES = ("#F1B6B8", "#E07F83", "#C44E52", "#8E2F33", "#5A1A1D")
# Published values: diamonds filled with their method's (or cluster's) colour.
_PUBLISHED = dict(shape="diamond", size=110, filled=True, opacity=1, stroke="black", strokeWidth=1)
_LEGEND = alt.Legend(symbolType="stroke", symbolOpacity=1, symbolStrokeWidth=3)


def chips_chart(df: pd.DataFrame) -> alt.LayerChart:
    """Goodput vs chips (log x): simulated means as dots with their 95% interval, the closed
    form as a dashed line, the published values as diamonds in the method's colour.
    Columns: method, chips, goodput, low, high, expected, published."""
    color = _method_color(df)
    df = df.assign(method=df.method.map(method_label))
    x = alt.X("chips:Q", title="chips",
              scale=alt.Scale(type="log", nice=False,
                              domain=[df.chips.min() / 1.15, df.chips.max() * 1.15]),
              axis=alt.Axis(format="~s"))
    y = alt.Y("goodput:Q", title="goodput", axis=alt.Axis(format="%"),
              scale=alt.Scale(domain=[0, 1]))
    base = alt.Chart(df).encode(x=x, color=color)
    closed = base.mark_line(strokeDash=[6, 4], strokeWidth=1.5).encode(y=alt.Y("expected:Q"))
    interval = base.mark_rule(strokeWidth=1.5).encode(y=alt.Y("low:Q"), y2="high:Q")
    simulated = base.mark_point(filled=True, size=40, opacity=1).encode(
        y=y, tooltip=["method", "chips", alt.Tooltip("goodput:Q", format=".1%"),
                      alt.Tooltip("expected:Q", title="closed form", format=".1%"),
                      alt.Tooltip("published:Q", format=".0%")])
    published = alt.Chart(df.dropna(subset=["published"])).mark_point(**_PUBLISHED).encode(
        x=x, y="published:Q", color=color, tooltip=["method", "chips", "published"])
    return alt.layer(closed, interval, simulated, published).properties(
        width=460, height=300,
        title="Goodput vs cluster size (dots: simulated, 95% interval; dashed: closed form; "
              "diamonds: published)")


def learners_chart(df: pd.DataFrame, chips_df: pd.DataFrame | None = None) -> alt.LayerChart:
    """Decoupled goodput vs learners M (log2 x), one line per cluster size, published values as
    diamonds; with `chips_df`, data-parallel and elastic data-parallel at the same sizes as
    dashed rules, labelled at the right end. Columns: learners, chips, goodput, low, high,
    published."""
    df = df.assign(cluster=[f"{n / 1e6:g}M chips" for n in df.chips])
    x = alt.X("learners:Q", scale=alt.Scale(type="log", base=2), title="learners M",
              axis=alt.Axis(values=sorted(df.learners.unique())))
    color = alt.Color("cluster:N", title="cluster", legend=_LEGEND,
                      scale=alt.Scale(range=[PALETTE["decoupled"], "#5A1A1D"]))
    base = alt.Chart(df).encode(x=x, color=color)
    layers = [
        base.mark_area(opacity=0.2).encode(y="low:Q", y2="high:Q"),
        base.mark_line(point=True).encode(
            y=alt.Y("goodput:Q", title="goodput", axis=alt.Axis(format="%"),
                    scale=alt.Scale(domain=[0, 1])),
            tooltip=["cluster", "learners", alt.Tooltip("goodput:Q", format=".1%")]),
        alt.Chart(df.dropna(subset=["published"])).mark_point(**_PUBLISHED).encode(
            x=x, y="published:Q", color=color),
    ]
    if chips_df is not None:
        ref = chips_df[chips_df.method.isin(["dp", "elastic_dp"])
                       & chips_df.chips.isin(df.chips.unique())]
        ref = ref.assign(label=[f"{method_label(m)}, {n / 1e6:g}M chips"
                                for m, n in zip(ref.method, ref.chips, strict=True)],
                         label_y=spread(list(ref.goodput), gap=0.05))
        rule = alt.Chart(ref)
        layers += [rule.mark_rule(strokeDash=[4, 3], color="gray").encode(y="goodput:Q"),
                   rule.mark_text(align="right", dy=-6, color="gray").encode(
                       x=alt.value(456), y="label_y:Q", text="label:N")]
    return alt.layer(*layers).properties(
        width=460, height=300, title="Decoupled DiLoCo: goodput vs learners (diamonds: published)")


def buckets_chart(df: pd.DataFrame) -> alt.Chart:
    """Where the chip-time goes: one stacked bar per method. Columns: method, bucket, fraction."""
    order = list(BUCKET_COLORS)
    df = df.assign(order=df.bucket.map(order.index), method=df.method.map(method_label))
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("method:N", sort=list(dict.fromkeys(df.method)), title=None),
        x=alt.X("fraction:Q", stack="zero", title="share of wall time × chips",
                axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("bucket:N", sort=order, title="bucket",
                        scale=alt.Scale(domain=order, range=list(BUCKET_COLORS.values()))),
        order=alt.Order("order:Q"),
        tooltip=["method", "bucket", alt.Tooltip("fraction:Q", format=".1%")],
    ).properties(width=460, height=32 * df.method.nunique(), title="Where the chip-time goes")


def timeline_chart(df: pd.DataFrame) -> alt.Chart:
    """Which domain is up, down (detect + reschedule) or recovering (reload / rejoin), over
    time. Columns: lane, state, start_min, end_min."""
    states = list(STATE_COLORS)
    learners = sum(lane.startswith("learner") for lane in df.lane.unique())
    df = df.assign(lane=df.lane.replace({"dp job": "data-parallel job"}))
    return alt.Chart(df).mark_bar(height=12).encode(
        x=alt.X("start_min:Q", title="minutes"), x2="end_min:Q",
        y=alt.Y("lane:N", sort=list(dict.fromkeys(df.lane)), title=None),
        color=alt.Color("state:N", sort=states, title="state",
                        scale=alt.Scale(domain=states, range=list(STATE_COLORS.values()))),
        tooltip=["lane", "state", alt.Tooltip("start_min:Q", format=".2f"),
                 alt.Tooltip("end_min:Q", format=".2f")],
    ).properties(width=560, height=22 * df.lane.nunique(),
                 title=f"Who is up: the data-parallel job vs {learners} learners")


def _method_color(df: pd.DataFrame) -> alt.Color:
    """Colour by method (config names in `df`), legend in words; Decoupled in shades of red."""
    names = list(dict.fromkeys(df.method))
    decoupled = [m for m in names if m.startswith("decoupled")]
    shades = dict(zip(decoupled, _DECOUPLED_SHADES[1:] if len(decoupled) < 5
                      else _DECOUPLED_SHADES, strict=False))
    colors = [PALETTE.get(m, shades.get(m, "#8C8C8C")) for m in names]
    labels = [method_label(m) for m in names]
    return alt.Color("method:N", sort=labels, title="method", legend=_LEGEND,
                     scale=alt.Scale(domain=labels, range=colors))
