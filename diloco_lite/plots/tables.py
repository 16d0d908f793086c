"""Tables a learner reads at a glance: the numbers of the notebooks' DataFrames, formatted.

`styled(df, percent=[...], nbytes=[...], times=[...])` returns a pandas `Styler` (the frame is
not changed): percent where the prose says percent, bytes in KB/MB/GB, ratios as "12.3×", every
other number with thousands separators and at most four significant digits, never `8.192e+04`.
The formatters are plain functions too, for f-strings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

_BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"))


def number(x: float) -> str:
    """12,345 · 198 · 1.5 · 0.0421: separators from 1,000 up, ≤ 4 significant digits below."""
    if _missing(x):
        return "–"
    x = float(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if x == 0 or abs(x) >= 1e-4:
        return f"{x:.4g}"
    return f"{x:.2e}"


def percent(x: float, digits: int = 1) -> str:
    """0.265 -> '26.5%'."""
    return "–" if _missing(x) else f"{100 * float(x):.{digits}f}%"


def points(x: float, digits: int = 1) -> str:
    """A difference of two fractions in percentage points: 0.012 -> '+1.2 pp'."""
    return "–" if _missing(x) else f"{100 * float(x):+.{digits}f} pp"


def nbytes(x: float) -> str:
    """Bytes in decimal units, as the prose writes them: 3,477,504 -> '3.48 MB'."""
    if _missing(x):
        return "–"
    x = float(x)
    for size, unit in _BYTE_UNITS:
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:,.0f} B"


def times(x: float) -> str:
    """A ratio: 233.9 -> '234×', 0.25 -> '0.25×'."""
    if _missing(x):
        return "–"
    x = float(x)
    return f"{x:,.0f}×" if abs(x) >= 100 else f"{x:.3g}×"


_percent, _nbytes, _times, _points = percent, nbytes, times, points  # `styled` reuses the names


def styled(df: pd.DataFrame, *, percent: Iterable[str] = (), nbytes: Iterable[str] = (),
           times: Iterable[str] = (), points: Iterable[str] = (), hide_index: bool = False):
    """`df.style` with each named column in its format and every other numeric column as
    `number`; column names must exist (a typo raises a `ValueError` naming it)."""
    formats = {}
    for columns, fmt in ((percent, _percent), (nbytes, _nbytes), (times, _times),
                         (points, _points)):
        for col in columns:
            if col not in df.columns:
                raise ValueError(f"column={col!r} is invalid: must be one of {list(df.columns)}")
            formats[col] = fmt
    for col in df.columns:
        if col not in formats and pd.api.types.is_numeric_dtype(df[col]):
            formats[col] = number
    style = df.style.format(formats)
    return style.hide(axis="index") if hide_index else style


def _missing(x) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return False

