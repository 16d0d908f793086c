"""Figures of the bandwidth simulator (`diloco_lite.systems.bandwidth`, `.bandwidth_report`).

Each builder takes tidy data and returns an Altair chart; save it with
`diloco_lite.plots.save(chart, name)`. `systems.bandwidth_report.reproduce_job` writes
`figures/bandwidth_utilization`, `figures/bandwidth_required` and `figures/bandwidth_sensitivity`.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from . import method_colors, method_label

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
