"""Charts: one Altair theme, one offline renderer, one `save` for every figure.

Why PNG: with altair 6 the default renderer loads Vega from a CDN (blank offline: "Error
loading script") and JupyterLab 4.6's built-in `mimetype` renderer does not take Vega-Lite 6.
Our renderer draws the chart in-process with vl-convert, so the image is in the notebook
output itself and shows in JupyterLab offline, in Colab and on GitHub's notebook view.

The one switch for interactive charts: the same output also carries the chart's Vega-Lite spec
under CHART_MIME, a type no notebook front end knows, so JupyterLab, Colab and GitHub show the
PNG. The book (`make book`) draws the spec instead, with the Vega bundled into the site: its
tooltips, selections and sliders work there. A chart is written once; where it is interactive
is the front end's choice, not a second version of the figure.

Figure builders live next to their topic (`plots.training`, `plots.bandwidth`, ...); each one
saves under `figures/` (of `paths.project_root()`: the clone, or the working directory on Colab)
as SVG and PNG through `save`.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from .. import paths

RENDERER = "diloco_lite"  # PNG for the notebook front ends, plus the spec for the book
CHART_MIME = "application/vnd.diloco-lite.vegalite+json"

# Legends and tables name methods in words, not by their config names.
LABELS = {
    "ddp": "DDP",
    "diloco": "DiLoCo",
    "streaming_diloco": "Streaming DiLoCo",
    "decoupled_diloco": "Decoupled DiLoCo",
    "dp": "data-parallel",
    "elastic_dp": "elastic data-parallel",
    "decoupled": "Decoupled DiLoCo",
}
FONT = "Liberation Sans, Arial, Helvetica, sans-serif"  # one font for every piece of text

PALETTE = {
    "ddp": "#4C72B0",
    "diloco": "#DD8452",
    "streaming_diloco": "#55A868",
    "decoupled_diloco": "#C44E52",
    "dp": "#4C72B0",
    "elastic_dp": "#8172B3",
    "decoupled": "#C44E52",
}


def method_label(name: str) -> str:
    """A method's name in words: 'streaming_diloco' -> 'Streaming DiLoCo', 'elastic_dp' ->
    'elastic data-parallel', 'decoupled M=8' -> 'Decoupled DiLoCo M=8'; unknown names pass."""
    head, _, rest = str(name).partition(" ")
    return f"{LABELS.get(head, head)} {rest}".strip()


def method_colors(methods) -> tuple[list[str], list[str]]:
    """(labels, colors) for the methods named in `methods` (config names), in PALETTE order."""
    names = [m for m in PALETTE if m in set(methods)]
    return [method_label(m) for m in names], [PALETTE[m] for m in names]


def spread(values, gap: float) -> list[float]:
    """Positions for end-of-line labels: each as close to its value as possible, consecutive
    ones at least `gap` apart (same units), order kept. Returns them in the input order."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    placed: list[float] = []
    for i in order:  # push up from below ...
        placed.append(max(values[i], placed[-1] + gap) if placed else values[i])
    shift = max(0.0, (placed[-1] - values[order[-1]]) / 2) if placed else 0.0
    out = [0.0] * len(values)
    for rank, i in enumerate(order):  # ... then centre the stack on the values
        out[i] = placed[rank] - shift
    return out


def _theme() -> dict:
    text = {"font": FONT, "fontSize": 11}
    return {
        "config": {
            "view": {"continuousWidth": 420, "continuousHeight": 260, "stroke": None},
            "font": FONT,
            "axis": {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 11,
                     "titleFontSize": 12, "grid": True, "gridOpacity": 0.4},
            "legend": {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 11,
                       "titleFontSize": 12, "labelLimit": 320},
            "header": {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 12,
                       "titleFontSize": 12},
            "title": {"font": FONT, "subtitleFont": FONT, "fontSize": 14, "anchor": "start"},
            "text": text,
            "range": {"category": list(PALETTE.values())[:4] + ["#937860", "#DA8BC3", "#8C8C8C"]},
        }
    }


def enable() -> None:
    """Select the project theme and the offline PNG renderer (idempotent; called by `save`)."""
    import altair as alt

    if "diloco_lite" not in alt.theme.names():
        alt.theme.register("diloco_lite", enable=False)(_theme)
    alt.theme.enable("diloco_lite")
    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, _render)
    alt.renderers.enable(RENDERER, scale_factor=2.0)


def _render(spec: dict, **metadata):
    """The PNG (vl-convert, in-process) and, beside it, the spec for the book (CHART_MIME)."""
    try:  # altair 6; Colab's altair 5 has the same function one module over
        from altair.vegalite.v6.display import png_renderer
    except ImportError:
        from altair.vegalite.v5.display import png_renderer

    out = png_renderer(spec, **metadata)
    data, meta = out if isinstance(out, tuple) else (out, {})
    return {**data, CHART_MIME: spec}, meta


def default_figures_dir() -> Path:
    """`figures/`, or the git-ignored `figures/quick/` in quick mode (DILOCO_LITE_QUICK=1), so
    that a quick CI-sized run never overwrites the full-size figures the README shows."""
    return paths.figures_dir(quick_mode())


def quick_mode() -> bool:
    """Quick mode: notebooks and `reproduce` shrink steps, not code paths. DILOCO_LITE_QUICK=1
    turns it on, =0 off; unset, it is on in Colab (a student who opens a notebook from its badge
    gets the minutes-long version; `%env DILOCO_LITE_QUICK=0` at the top asks for the full one)
    and off elsewhere."""
    import sys

    value = os.environ.get("DILOCO_LITE_QUICK", "")
    return value == "1" if value in ("0", "1") else "google.colab" in sys.modules


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
