"""Charts render with no internet: the renderer puts an image in the output itself."""

import base64
import io

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


def _points(y_shift: float):
    data = pd.DataFrame({"x": [1, 2, 3], "y": [1.0 + y_shift, 4, 9]})
    return alt.Chart(data).mark_point().encode(x="x:Q", y="y:Q", tooltip=["y:Q"])


def test_save_keeps_the_files_of_the_same_picture(tmp_path):
    """A re-run whose numbers differ invisibly (here 1e-7 in a value, as after a CSV round
    trip) must not rewrite the committed figures; a different picture must."""
    plots.save(_points(0.0), "demo", tmp_path)
    svg, png = (tmp_path / "demo.svg").read_text(), (tmp_path / "demo.png").read_bytes()
    same = io.StringIO()
    _points(1e-7).save(same, format="svg")
    assert same.getvalue() != svg  # the SVG text differs (its ARIA label) ...
    plots.save(_points(1e-7), "demo", tmp_path)  # ... but not the picture: files untouched
    assert (tmp_path / "demo.svg").read_text() == svg
    assert (tmp_path / "demo.png").read_bytes() == png
    plots.save(_points(2.0), "demo", tmp_path)
    assert (tmp_path / "demo.png").read_bytes() != png
    assert (tmp_path / "demo.svg").read_text() != svg


def test_rendering_is_deterministic(tmp_path):
    for run in ("a", "b"):
        plots.save(_points(0.0), run, tmp_path)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert (tmp_path / "a.svg").read_text() == (tmp_path / "b.svg").read_text()
