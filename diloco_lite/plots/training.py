"""Figures of training runs: loss and accuracy curves, bytes sent, accuracy per byte.

Every builder takes runs as `{method: history}` (a `RunResult`, or its `.history` DataFrame),
a single `RunResult`, or long-form data already tidied by `tidy`, and returns an Altair chart;
save it with `diloco_lite.plots.save(chart, name)`. Colours come from `plots.PALETTE`, keyed by
the method name ("ddp", "diloco", "streaming_diloco", "decoupled_diloco"); any other label
(e.g. "diloco H=50") gets a colour of its own.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from . import PALETTE

METRICS = ("train_loss", "val_loss", "val_accuracy", "comm_bytes", "peak_step_bytes")
_EXTRA_COLOURS = ("#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD", "#8172B3")
_AXIS_TITLES = {"step": "step", "tokens": "tokens seen (all workers)"}


def tidy(runs: Any, metrics=METRICS) -> pd.DataFrame:
    """Long-form rows `method, step, tokens, metric, value` from runs (see module docstring).

    A DataFrame that already has `metric` and `value` columns is returned as is; a wide history
    needs a `method` column unless it is given in a dict."""
    if isinstance(runs, pd.DataFrame) and {"metric", "value"} <= set(runs.columns):
        return runs
    if isinstance(runs, pd.DataFrame) and "method" in runs.columns:
        runs = {m: h.drop(columns="method") for m, h in runs.groupby("method", sort=False)}
    if not isinstance(runs, dict):  # one RunResult
        runs = {runs.config.algorithm.name: runs}
    frames = []
    for method, run in runs.items():
        history = getattr(run, "history", run)
        cols = [m for m in metrics if m in history.columns]
        long = history.melt(id_vars=["step", "tokens"], value_vars=cols, var_name="metric")
        frames.append(long.assign(method=method))
    out = pd.concat(frames, ignore_index=True)
    return out[["method", "step", "tokens", "metric", "value"]]


def loss_curves(runs: Any, x: str = "step") -> alt.Chart:
    """Train (dashed) and held-out (solid) loss, next to held-out accuracy, against `x`
    ("step" or "tokens")."""
    df = tidy(runs, ("train_loss", "val_loss", "val_accuracy"))
    df = df.assign(split=df.metric.map({"train_loss": "train", "val_loss": "held-out",
                                        "val_accuracy": "held-out"}))
    base = alt.Chart().mark_line(strokeWidth=2).encode(
        x=alt.X(f"{x}:Q", title=_AXIS_TITLES.get(x, x),
                axis=alt.Axis(format="~s") if x == "tokens" else alt.Axis()),
        color=method_color(df),
        tooltip=["method", "step", "tokens", "metric", alt.Tooltip("value:Q", format=".4f")],
    ).properties(width=300, height=220)
    loss = base.transform_filter("datum.metric != 'val_accuracy'").encode(
        y=alt.Y("value:Q", title="cross-entropy (nats/char)", scale=alt.Scale(zero=False)),
        strokeDash=alt.StrokeDash("split:N", sort=["held-out", "train"], title="loss"),
    ).properties(title="Loss")
    acc = base.transform_filter("datum.metric == 'val_accuracy'").encode(
        y=alt.Y("value:Q", title="next-character accuracy", axis=alt.Axis(format="%"),
                scale=alt.Scale(zero=False)),
    ).properties(title="Held-out accuracy")
    return alt.hconcat(loss, acc, data=df)


def bytes_per_step(runs: Any) -> alt.Chart:
    """Bytes sent by all workers: mean per step between evaluations (left) and cumulative
    (right), both on log axes so that DDP and DiLoCo fit on one chart."""
    df = tidy(runs, ("comm_bytes",)).sort_values(["method", "step"])
    grouped = df.groupby("method", sort=False)
    sent = grouped["value"].diff().fillna(df["value"])  # the first row counts from step 0
    df = df.assign(per_step=sent / grouped["step"].diff().fillna(df["step"]))
    base = alt.Chart(df).mark_line(strokeWidth=2, point=True).encode(
        x=alt.X("step:Q", title="step"),
        color=method_color(df),
        tooltip=["method", "step", alt.Tooltip("per_step:Q", format=".4s"),
                 alt.Tooltip("value:Q", format=".4s")],
    ).properties(width=300, height=220)
    mean = base.encode(y=alt.Y("per_step:Q", scale=alt.Scale(type="log"),
                               title="bytes per step", axis=alt.Axis(format="~s")))
    total = base.mark_line(strokeWidth=2).encode(
        y=alt.Y("value:Q", scale=alt.Scale(type="log"), title="cumulative bytes",
                axis=alt.Axis(format="~s")))
    return alt.hconcat(mean.properties(title="Bytes sent per step"),
                       total.properties(title="Bytes sent so far"))


def accuracy_vs_bytes(runs: Any, metric: str = "val_accuracy") -> alt.Chart:
    """`metric` (held-out accuracy by default) against cumulative bytes sent, log x: the
    communication cost of reaching a given quality, one line per method."""
    df = tidy(runs, (metric, "comm_bytes"))
    wide = df.pivot_table(index=["method", "step", "tokens"], columns="metric",
                          values="value", sort=False).reset_index()
    wide = wide[wide.comm_bytes > 0]
    is_acc = metric.endswith("accuracy")
    return alt.Chart(wide).mark_line(strokeWidth=2, point=True).encode(
        x=alt.X("comm_bytes:Q", scale=alt.Scale(type="log"), title="bytes sent (all workers)",
                axis=alt.Axis(format="~s")),
        y=alt.Y(f"{metric}:Q", title=metric.replace("_", " "), scale=alt.Scale(zero=False),
                axis=alt.Axis(format="%") if is_acc else alt.Axis()),
        color=method_color(wide),
        tooltip=["method", "step", alt.Tooltip("comm_bytes:Q", format=".4s"),
                 alt.Tooltip(f"{metric}:Q", format=".4f")],
    ).properties(width=420, height=260, title=f"{metric.replace('_', ' ')} vs bytes sent")


def method_color(df: pd.DataFrame) -> alt.Color:
    """Colour by `method`: PALETTE colours for known names, then distinct extras."""
    methods = list(dict.fromkeys(df.method))
    extras = iter(_EXTRA_COLOURS * (1 + len(methods) // len(_EXTRA_COLOURS)))
    colours = [PALETTE[m] if m in PALETTE else next(extras) for m in methods]
    return alt.Color("method:N", scale=alt.Scale(domain=methods, range=colours), title="method")
