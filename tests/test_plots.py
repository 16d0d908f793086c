"""Charts render with no internet: the renderer puts an image in the output itself."""

import base64

import altair as alt
import pandas as pd

from diloco_lite import plots


def _chart():
    return alt.Chart(pd.DataFrame({"x": [1, 2, 3], "y": [1, 4, 9]})).mark_line().encode(
        x="x:Q", y="y:Q")


def test_the_chosen_renderer_produces_an_image_output():
    plots.enable()
    assert alt.renderers.active == plots.RENDERER == "png"
    bundle = _chart()._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    # no HTML/JavaScript that would fetch Vega from a CDN: only the image itself
    assert set(data) == {"image/png"}
    png = data["image/png"]
    png = base64.b64decode(png) if isinstance(png, str) else png
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_save_writes_svg_and_png(tmp_path):
    plots.save(_chart(), "demo", tmp_path)
    assert (tmp_path / "demo.svg").read_text().lstrip().startswith("<svg")
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"


def test_quick_mode_never_overwrites_the_readme_figures(monkeypatch):
    monkeypatch.setenv("DILOCO_LITE_QUICK", "1")
    assert plots.default_figures_dir() == plots.FIGURES_DIR / "quick"
    monkeypatch.delenv("DILOCO_LITE_QUICK")
    assert plots.default_figures_dir() == plots.FIGURES_DIR
