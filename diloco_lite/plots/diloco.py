"""Figures of the DiLoCo and Streaming DiLoCo experiments (`diloco_lite.experiments`).

Every builder takes `{label: history}` (a `RunResult.history` DataFrame, or the `RunResult`)
and returns an Altair chart; `experiments.figures(group, histories)` names them and
`diloco_lite.plots.save(chart, name)` writes them under `figures/`. Labels that start with
"DDP" are drawn in the data-parallel blue, the others in distinct colours, in the given order.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd

from . import PALETTE

_COLOURS = ("#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
            "#CCB974", "#64B5CD", "#1B9E77")
_DDP_COLOURS = (PALETTE["ddp"], "#9DB4DA")
_TOKENS = alt.X("tokens:Q", title="tokens seen (all workers)", axis=alt.Axis(format="~s"))


def tidy(histories: dict[str, Any], metrics: tuple[str, ...]) -> pd.DataFrame:
    """Long-form rows `method, step, tokens, metric, value` (NaN values dropped)."""
    frames = []
    for label, h in histories.items():
        h = getattr(h, "history", h)
        cols = [m for m in metrics if m in h.columns]
        if cols:
            long = h.melt(id_vars=["step", "tokens"], value_vars=cols, var_name="metric")
            frames.append(long.assign(method=label))
    if not frames:
        return pd.DataFrame(columns=["method", "step", "tokens", "metric", "value"])
    out = pd.concat(frames, ignore_index=True).dropna(subset=["value"])
    return out[["method", "step", "tokens", "metric", "value"]]


def finals(histories: dict[str, Any]) -> pd.DataFrame:
    """One row per label: the last history row (final metrics, total and peak bytes)."""
    rows = [getattr(h, "history", h).iloc[-1].to_dict() | {"method": k}
            for k, h in histories.items()]
    return pd.DataFrame(rows)


def colour(labels) -> alt.Color:
    """Colour by `method`: DDP labels in blue, every other label its own colour."""
    labels = list(dict.fromkeys(labels))
    ddp, other = iter(_DDP_COLOURS * len(labels)), iter(_COLOURS * len(labels))
    rng = [next(ddp) if lab.startswith("DDP") else next(other) for lab in labels]
    return alt.Color("method:N", scale=alt.Scale(domain=labels, range=rng), title=None,
                     sort=labels, legend=alt.Legend(orient="right", labelLimit=260))


def curves(histories: dict[str, Any], title: str = "") -> alt.Chart:
    """Held-out loss (left) and accuracy (right) against tokens, one line per label. In the book
    (interactive charts) a click on a legend entry picks its lines in both panels (shift-click
    adds one); the PNG shows every line."""
    df = tidy(histories, ("val_loss", "val_accuracy"))
    pick = alt.selection_point(fields=["method"], bind="legend")
    base = alt.Chart(df).mark_line(strokeWidth=2).encode(
        x=_TOKENS, color=colour(histories),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        tooltip=["method", "step", alt.Tooltip("value:Q", format=".4f")],
    ).properties(width=300, height=230)
    loss = base.transform_filter("datum.metric == 'val_loss'").add_params(pick).encode(
        y=alt.Y("value:Q", title="held-out loss (nats/char)", scale=alt.Scale(zero=False)))
    acc = base.transform_filter("datum.metric == 'val_accuracy'").encode(
        y=alt.Y("value:Q", title="held-out next-char accuracy", axis=alt.Axis(format="%"),
                scale=alt.Scale(zero=False)))
    return alt.hconcat(loss.properties(title="Held-out loss"),
                       acc.properties(title="Held-out accuracy")).properties(title=title)


def accuracy_vs_bytes(histories: dict[str, Any],
                      title: str = "Accuracy vs bytes exchanged, at equal tokens") -> alt.Chart:
    """Held-out accuracy against cumulative bytes sent (log x): a thin line per run through its
    evaluation points, and a dot where it ends (every run ends at the same tokens). The labels
    stand in one column right of the data, in the order of the ends' heights and spread so that
    none overlaps, each tied to its dot by a leader line."""
    df = pd.concat([getattr(h, "history", h)[["step", "tokens", "val_accuracy", "comm_bytes"]]
                    .assign(method=k) for k, h in histories.items()], ignore_index=True)
    df = df[df.comm_bytes > 0]
    y_range = (float(df.val_accuracy.min()), float(df.val_accuracy.max()))
    end = label_column(finals(histories), "comm_bytes", "val_accuracy", y_range)
    x = alt.X("comm_bytes:Q", scale=alt.Scale(type="log"), title="bytes sent, all workers (log)",
              axis=alt.Axis(format="~s"))
    y = alt.Y("val_accuracy:Q", title="held-out accuracy", axis=alt.Axis(format="%"),
              scale=alt.Scale(zero=False))
    col = colour(histories).legend(None)
    tip = ["method", "step", alt.Tooltip("comm_bytes:Q", format=".3s"),
           alt.Tooltip("val_accuracy:Q", format=".2%")]
    lines = alt.Chart(df).mark_line(strokeWidth=1.2, opacity=0.6).encode(
        x=x, y=y, color=col, detail="method:N", tooltip=tip)
    dots = alt.Chart(end).mark_point(filled=True, size=90).encode(x=x, y=y, color=col,
                                                                  tooltip=tip)
    leaders = alt.Chart(end).mark_rule(strokeWidth=0.7, opacity=0.6).encode(
        x=x, y=y, x2="label_x:Q", y2="label_y:Q", color=col)
    text = alt.Chart(end).mark_text(align="left", dx=3, fontSize=11).encode(
        x="label_x:Q", y="label_y:Q", text="method:N", color=col)
    return (lines + leaders + dots + text).properties(
        width=440, height=300, title=title, padding={"right": 240, "left": 5, "top": 5,
                                                     "bottom": 5})


def label_column(end: pd.DataFrame, x: str, y: str, y_range: tuple[float, float],
                 gap: float = 0.055) -> pd.DataFrame:
    """`end` with `label_x` (a little right of the largest x, log scale) and `label_y` (the ends'
    heights, sorted and pushed apart to at least `gap` of `y_range`, centred on them)."""
    end = end.sort_values(y).reset_index(drop=True)
    span = max(y_range[1] - y_range[0], 1e-9)
    ys = end[y].to_numpy(float).copy()
    for j in range(1, len(ys)):
        ys[j] = max(ys[j], ys[j - 1] + gap * span)
    ys -= ys.mean() - end[y].mean()
    return end.assign(label_x=float(end[x].max()) * 10 ** 0.45, label_y=ys)


def peak_bytes(histories: dict[str, Any],
               title: str = "Bytes per sync burst and in total") -> alt.Chart:
    """Peak bytes sent in one step (left) and total bytes (right) per label, log axes, with
    each bar's reduction against the largest."""
    end = finals(histories)
    end = end.assign(
        peak_x=end.peak_step_bytes.max() / end.peak_step_bytes,
        total_x=end.comm_bytes.max() / end.comm_bytes,
    )
    end = end.assign(peak_txt=[f"÷{x:,.1f}" for x in end.peak_x],
                     total_txt=[f"÷{x:,.1f}" for x in end.total_x])
    order = list(histories)
    panels = []
    for field, ratio, name in (("peak_step_bytes", "peak_x", "peak bytes in one step"),
                               ("comm_bytes", "total_x", "total bytes sent")):
        floor = 10 ** math.floor(math.log10(end[field].min()))  # log bars need a start > 0
        base = alt.Chart(end.assign(floor=floor)).encode(
            y=alt.Y("method:N", sort=order, title=None),
            x=alt.X(f"{field}:Q", scale=alt.Scale(type="log"), title=f"{name} (log)",
                    axis=alt.Axis(format="~s")),
            tooltip=["method", alt.Tooltip(f"{field}:Q", format=".4s"),
                     alt.Tooltip(f"{ratio}:Q", format=".1f", title="÷ vs largest")],
        )
        bars = base.mark_bar().encode(x2="floor:Q", color=colour(order).legend(None))
        text = base.mark_text(align="left", dx=4, fontSize=10).encode(
            text=f"{ratio.replace('_x', '_txt')}:N")
        panels.append((bars + text).properties(width=240, height=22 * len(order), title=name))
    return alt.hconcat(*panels).properties(title=title)


def cosine(histories: dict[str, Any], title: str = "Pseudo-gradient agreement") -> alt.Chart:
    """Mean pairwise cosine similarity of the workers' pseudo-gradients Δ_m at each sync
    (left) and the mean worker drift ‖Δ_m‖ (right), against tokens; DDP runs have neither."""
    df = tidy(histories, ("pseudo_grad_cosine", "worker_drift"))
    labels = list(dict.fromkeys(df.method))
    base = alt.Chart(df).mark_line(strokeWidth=2, point=True).encode(
        x=_TOKENS, color=colour(labels),
        tooltip=["method", "step", "metric", alt.Tooltip("value:Q", format=".3f")],
    ).properties(width=300, height=230)
    cos = base.transform_filter("datum.metric == 'pseudo_grad_cosine'").encode(
        y=alt.Y("value:Q", title="mean cos(Δ_m, Δ_n), m ≠ n"))
    drift = base.transform_filter("datum.metric == 'worker_drift'").encode(
        y=alt.Y("value:Q", title="mean ‖Δ_m‖ (log)", scale=alt.Scale(type="log")))
    return alt.hconcat(cos.properties(title="Cosine between workers' Δ"),
                       drift.properties(title="How far each worker moved")).properties(
        title=title)


def final_metric(histories: dict[str, Any], metric: str = "val_loss",
                 title: str = "") -> alt.Chart:
    """One dot per label: the final value of `metric` (e.g. held-out loss), labels in order."""
    end = finals(histories)
    order = list(histories)
    is_acc = metric.endswith("accuracy")
    return alt.Chart(end).mark_point(filled=True, size=90).encode(
        y=alt.Y("method:N", sort=order, title=None),
        x=alt.X(f"{metric}:Q", scale=alt.Scale(zero=False), title=f"final {metric}",
                axis=alt.Axis(format="%") if is_acc else alt.Axis()),
        color=colour(order).legend(None),
        tooltip=["method", alt.Tooltip(f"{metric}:Q", format=".4f")],
    ).properties(width=320, height=22 * len(order), title=title or f"final {metric}")
