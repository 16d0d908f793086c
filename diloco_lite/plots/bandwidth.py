"""Figures of the bandwidth simulator (`diloco_lite.systems.bandwidth`, `.bandwidth_report`).

Each builder takes tidy data and returns an Altair chart; save it with
`diloco_lite.plots.save(chart, name)`. `systems.bandwidth_report.reproduce_job` writes
`figures/bandwidth_utilization`, `figures/bandwidth_required` and `figures/bandwidth_sensitivity`.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from . import PALETTE, method_colors, method_label

# The sensitivity chart's assumptions in words (field of `bandwidth_report.Reconstruction`).
ASSUMPTIONS = {
    "n_params": ("parameters", ""), "step_time_s": ("step time", " s"),
    "target_utilization": ("target utilization", ""), "datacenters": ("datacenters", ""),
    "grad_bits": ("DDP gradient bits", ""), "bits": ("Decoupled bits", ""),
    "inner_steps": ("H, inner steps", ""), "fragments": ("P, fragments", ""),
    "overlap": ("τ, overlap", ""), "latency_s": ("latency", " s"), "buckets": ("buckets", ""),
}


def utilization_chart(df: pd.DataFrame) -> alt.Chart:
    """Compute utilization vs link bandwidth (log x), one line per method, one panel per model.

    Columns: method, model, bandwidth_gbps, utilization.
    """
    color = _method_color(df)
    line = (
        alt.Chart(_in_words(df))
        .mark_line(strokeWidth=2)
        .encode(
            x=alt.X(
                "bandwidth_gbps:Q", scale=alt.Scale(type="log"), title="link bandwidth (Gbit/s)"
            ),
            y=alt.Y(
                "utilization:Q",
                scale=alt.Scale(domain=[0, 1]),
                title="compute utilization",
                axis=alt.Axis(format="%"),
            ),
            color=color,
            tooltip=[
                "method",
                "model",
                alt.Tooltip("bandwidth_gbps:Q", format=".3g"),
                alt.Tooltip("utilization:Q", format=".1%"),
            ],
        )
        .properties(width=230, height=200)
    )
    return line.facet(
        column=alt.Column("model:N", title=None, sort=list(df.model.unique()))
    ).properties(title="Compute utilization vs bandwidth (8 replicas)")


def utilization_h_chart(df: pd.DataFrame, h: int = 100) -> alt.Chart:
    """DiLoCo's utilization vs bandwidth, one grey line per H, the chosen H drawn in colour;
    DDP dashed. In the book a slider chooses H (`make book`: interactive charts); the PNG shows
    `h`. Columns: those of `bandwidth_report.utilization_by_inner_steps`."""
    hs = sorted(df.loc[df.method == "diloco", "inner_steps"].unique())
    if h not in hs:
        raise ValueError(f"h must be one of the inner_steps in the data {hs}, got {h}")
    data = _in_words(df).assign(rank=df.inner_steps.map({v: i for i, v in enumerate(hs)}))
    pick = alt.param(name="H_rank", value=hs.index(h), bind=alt.binding_range(
        min=0, max=len(hs) - 1, step=1, name=f"H, in {len(hs)} steps from {hs[0]} to {hs[-1]}: "))
    x = alt.X("bandwidth_gbps:Q", scale=alt.Scale(type="log"), title="link bandwidth (Gbit/s)")
    y = alt.Y("utilization:Q", scale=alt.Scale(domain=[0, 1]), title="compute utilization",
              axis=alt.Axis(format="%"))
    tip = ["method", alt.Tooltip("inner_steps:Q", title="H"),
           alt.Tooltip("bandwidth_gbps:Q", format=".3g"),
           alt.Tooltip("utilization:Q", format=".1%")]
    diloco = alt.Chart(data).transform_filter(alt.datum.method == method_label("diloco"))
    every = diloco.mark_line(strokeWidth=1, color="#c8c8c8").encode(
        x=x, y=y, detail="inner_steps:O", tooltip=tip)
    chosen = diloco.transform_filter(alt.datum.rank == pick).mark_line(
        strokeWidth=3, color=PALETTE["diloco"]).encode(x=x, y=y, tooltip=tip)
    label = diloco.transform_filter(alt.datum.rank == pick).transform_filter(
        alt.datum.utilization >= 0.5).transform_aggregate(
        bandwidth_gbps="min(bandwidth_gbps)", inner_steps="max(inner_steps)").transform_calculate(
        text="'DiLoCo H = ' + datum.inner_steps").mark_text(
        align="right", dx=-6, dy=-8, fontSize=12, color=PALETTE["diloco"], fontWeight="bold"
        ).encode(x=x, y=alt.YDatum(0.5), text="text:N")
    ddp = alt.Chart(data).transform_filter(alt.datum.method == method_label("ddp")).mark_line(
        strokeWidth=2, strokeDash=[6, 3], color=PALETTE["ddp"]).encode(x=x, y=y, tooltip=tip)
    return (every + ddp + chosen + label).add_params(pick).properties(
        width=460, height=260, title=alt.TitleParams(
            "DiLoCo's utilization vs bandwidth: each H is one curve",
            subtitle=["10B parameters, 1.6 s per step, 8 replicas, bf16; DDP dashed; "
                      "grey: the other H",
                      "from H = 10 on, 10× more inner steps need about 10× less bandwidth"]))


def required_chart(df: pd.DataFrame) -> alt.Chart:
    """Required bandwidth (log y) vs target utilization, one line per method, one panel per model.

    Columns: method, model, target_utilization, required_gbps (inf rows are dropped).
    """
    df = df[np.isfinite(df.required_gbps) & (df.required_gbps > 0)]
    color = _method_color(df)
    base = alt.Chart(_in_words(df)).encode(
        x=alt.X(
            "target_utilization:Q",
            title="target utilization",
            axis=alt.Axis(format="%"),
            scale=alt.Scale(domain=[0.45, 1.0]),
        ),
        y=alt.Y(
            "required_gbps:Q", scale=alt.Scale(type="log"), title="required bandwidth (Gbit/s)"
        ),
        color=color,
        tooltip=[
            "method",
            "model",
            alt.Tooltip("target_utilization:Q", format=".0%"),
            alt.Tooltip("required_gbps:Q", format=".3g"),
        ],
    )
    chart = (base.mark_line() + base.mark_point(filled=True)).properties(width=230, height=200)
    return chart.facet(
        column=alt.Column("model:N", title=None, sort=list(df.model.unique()))
    ).properties(title="Bandwidth needed for a target utilization (8 replicas)")


def sensitivity_chart(df: pd.DataFrame, published: dict) -> alt.Chart:
    """Required bandwidth when one assumption changes at a time: filled dots are the
    reconstruction, rings the variations; the dashed rule (in the method's colour) marks the
    published figure. Columns: assumption, setting, is_default, method, required_gbps."""
    df = df[np.isfinite(df.required_gbps)].assign(published=lambda d: d.method.map(published))
    scale = _method_scale(df)
    color = alt.Color("method:N", scale=scale, title="method")
    df = _in_words(df).assign(setting=[setting_label(a, s) for a, s in
                                       zip(df.assumption, df.setting, strict=True)])
    points = (
        alt.Chart()
        .mark_point(size=60, strokeWidth=2)
        .encode(
            x=alt.X(
                "required_gbps:Q",
                scale=alt.Scale(type="log"),
                title="required bandwidth (Gbit/s)",
                axis=alt.Axis(labelOverlap="greedy", labelSeparation=6, format="~g"),
            ),
            y=alt.Y("setting:N", sort=list(df.setting.unique()), title=None),
            color=color,
            fill=alt.condition("datum.is_default", alt.Fill("method:N", scale=scale, legend=None),
                               alt.value("white")),
            tooltip=["setting", "method", alt.Tooltip("required_gbps:Q", format=".3g")],
        )
    )
    rule = alt.Chart().mark_rule(strokeDash=[5, 3], strokeWidth=1.5).encode(
        x="published:Q", color=alt.Color("method:N", scale=scale, legend=None))
    chart = alt.layer(points, rule, data=df).properties(width=260, height=14 * df.setting.nunique())
    return (
        chart.facet(column=alt.Column("method:N", title=None))
        .resolve_scale(x="independent")
        .properties(title="Sensitivity, one assumption at a time (filled: the reconstruction, "
                          "dashed: the published figure)")
    )


def setting_label(assumption: str, setting: str) -> str:
    """'n_params=3B' of assumption 'n_params' -> 'parameters = 3B' (see `ASSUMPTIONS`)."""
    words, unit = ASSUMPTIONS.get(assumption, (assumption, ""))
    return f"{words} = {str(setting).partition('=')[2] or setting}{unit}"


def _method_color(df: pd.DataFrame) -> alt.Color:
    """Colour by method, the legend in words; call it on config names (before `_in_words`)."""
    return alt.Color("method:N", scale=_method_scale(df), title="method")


def _method_scale(df: pd.DataFrame) -> alt.Scale:
    labels, colors = method_colors(df.method)
    return alt.Scale(domain=labels, range=colors)


def _in_words(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(method=df.method.map(method_label))
