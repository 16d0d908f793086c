"""The headline quality figure (`experiments.quality`): held-out accuracy over seeds, with its
spread, beside the bytes each method sent."""

from __future__ import annotations

import altair as alt
import pandas as pd

from . import PALETTE
from .tables import nbytes

_COLOUR = {"DDP": PALETTE["ddp"], "DiLoCo": PALETTE["diloco"],
           "Streaming DiLoCo": PALETTE["streaming_diloco"],
           "Decoupled DiLoCo": PALETTE["decoupled_diloco"],
           "Decoupled DiLoCo, chaos": "#E49B9D"}


# Label only the powers of ten of a log axis (1M, 10M, ...), not every minor tick.
_DECADES = ("abs(log(datum.value) / LN10 - round(log(datum.value) / LN10)) < 1e-6 ? "
            "format(datum.value, '~s') : ''")


def accuracy_with_spread(summary: pd.DataFrame) -> alt.HConcatChart:
    """Left: mean test-plays accuracy (dot) ± one standard deviation over seeds (bar) per method.
    Right: total bytes sent, log scale. `summary`: `experiments.quality.summary`'s table."""
    df = summary.assign(
        low=summary.test_accuracy - summary.test_accuracy_std,
        high=summary.test_accuracy + summary.test_accuracy_std,
        text=[f"{a:.1%} ± {s:.1%} ({n} seeds)" for a, s, n in
              zip(summary.test_accuracy, summary.test_accuracy_std, summary.seeds, strict=True)],
        sent=[nbytes(b) for b in summary.comm_bytes])
    order = list(df.method)
    colour = alt.Color("method:N", legend=None, scale=alt.Scale(
        domain=order, range=[_COLOUR.get(m, "#8C8C8C") for m in order]))
    y = alt.Y("method:N", sort=order, title=None)
    axis = dict(title="next-char accuracy on the test plays", axis=alt.Axis(format="%"),
                scale=alt.Scale(zero=False, padding=30))
    x = alt.X("test_accuracy:Q", **axis)
    base = alt.Chart(df).encode(y=y)
    bars = base.mark_rule(strokeWidth=3).encode(x=alt.X("low:Q", **axis), x2="high:Q",
                                                color=colour)
    dots = base.mark_point(filled=True, size=90, opacity=1).encode(
        x=x, color=colour, tooltip=["method", alt.Tooltip("test_accuracy:Q", format=".2%"),
                                    alt.Tooltip("test_accuracy_std:Q", format=".2%", title="std"),
                                    "seeds:Q"])
    text = base.mark_text(align="left", dx=8, dy=-10, fontSize=10, color="#333").encode(
        x=x, text="text:N")
    acc = (bars + dots + text).properties(width=360, height=34 * len(order),
                                          title="Test-plays accuracy, mean ± std over seeds")
    sent_x = alt.X("comm_bytes:Q", title="total bytes sent (log scale)",
                   scale=alt.Scale(type="log", padding=20), axis=alt.Axis(labelExpr=_DECADES))
    bytes_base = alt.Chart(df).encode(y=alt.Y("method:N", sort=order, axis=None), x=sent_x)
    sent = bytes_base.mark_point(filled=True, size=90, opacity=1).encode(
        color=colour, tooltip=["method", alt.Tooltip("comm_bytes:Q", format=",.0f")])
    sent_text = bytes_base.mark_text(align="left", dx=8, dy=-10, fontSize=10,
                                     color="#333").encode(text="sent:N")
    sent = (sent + sent_text).properties(width=220, height=34 * len(order), title="Bytes sent")
    return alt.hconcat(acc, sent).properties(
        title="Quality at equal tokens, by the papers' protocol (48 outer steps)")
