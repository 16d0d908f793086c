"""Charts: one Altair theme, one offline renderer, one `save` for every figure.

Why PNG: with altair 6 the default renderer loads Vega from a CDN (blank offline: "Error
loading script") and JupyterLab 4.6's built-in `mimetype` renderer does not take Vega-Lite 6.
The `png` renderer draws the chart in-process with vl-convert, so the image is in the notebook
output itself and shows in JupyterLab offline, in Colab and on GitHub's notebook view.

Figure builders live next to their topic (`plots.training`, `plots.bandwidth`, ...); each one
saves under `figures/` (of `paths.project_root()`: the clone, or the working directory on Colab)
as SVG and PNG through `save`.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from .. import paths

RENDERER = "png"

PALETTE = {
    "ddp": "#4C72B0",
    "diloco": "#DD8452",
    "streaming_diloco": "#55A868",
    "decoupled_diloco": "#C44E52",
    "dp": "#4C72B0",
    "elastic_dp": "#8172B3",
    "decoupled": "#C44E52",
}


def _theme() -> dict:
    return {
        "config": {
            "view": {"continuousWidth": 420, "continuousHeight": 260, "stroke": None},
            "font": "sans-serif",
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True, "gridOpacity": 0.4},
            "legend": {"labelFontSize": 11, "titleFontSize": 12},
            "title": {"fontSize": 14, "anchor": "start"},
            "range": {"category": list(PALETTE.values())[:4] + ["#937860", "#DA8BC3", "#8C8C8C"]},
        }
    }


def enable() -> None:
    """Select the project theme and the offline PNG renderer (idempotent; called by `save`)."""
    import altair as alt

    if "diloco_lite" not in alt.theme.names():
        alt.theme.register("diloco_lite", enable=False)(_theme)
    alt.theme.enable("diloco_lite")
    alt.renderers.enable(RENDERER, scale_factor=2.0)


def default_figures_dir() -> Path:
    """`figures/`, or the git-ignored `figures/quick/` in quick mode (DILOCO_LITE_QUICK=1), so
    that a quick CI-sized run never overwrites the full-size figures the README shows."""
    return paths.figures_dir(quick_mode())


def quick_mode() -> bool:
    """True when DILOCO_LITE_QUICK=1: notebooks and `reproduce` shrink steps, not code paths."""
    return os.environ.get("DILOCO_LITE_QUICK", "") == "1"


def save(chart, name: str, figures_dir: str | Path | None = None):
    """Write `chart` as `<figures_dir>/<name>.svg` and `.png`; return the chart for display.

    When both files exist and the new PNG is byte-identical to the old one, the pair is left
    untouched: the same picture is not rewritten. (The SVG alone may still differ in invisible
    text, e.g. the full-precision numbers of its ARIA labels when a value went through a CSV
    cache, which would make every notebook run dirty the committed figures.)
    """
    enable()
    out = Path(figures_dir) if figures_dir is not None else default_figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    png, svg = io.BytesIO(), io.StringIO()
    chart.save(png, format="png", scale_factor=2.0)
    chart.save(svg, format="svg")
    png_path, svg_path = out / f"{name}.png", out / f"{name}.svg"
    if not (svg_path.exists() and png_path.exists() and png_path.read_bytes() == png.getvalue()):
        svg_path.write_text(svg.getvalue(), encoding="utf-8")
        png_path.write_bytes(png.getvalue())
    return chart


def __getattr__(name: str):
    if name == "FIGURES_DIR":  # resolved when read: it follows the cwd and $DILOCO_LITE_HOME
        return paths.figures_dir()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
