"""Charts render with no internet: the renderer puts an image in the output itself."""

import base64
import io

import altair as alt
import numpy as np
import pandas as pd

from diloco_lite import plots


def _chart():
    return alt.Chart(pd.DataFrame({"x": [1, 2, 3], "y": [1, 4, 9]})).mark_line().encode(
        x="x:Q", y="y:Q")


def test_the_chosen_renderer_produces_an_image_output():
    plots.enable()
    assert alt.renderers.active == plots.RENDERER  # offline: drawn in-process, no CDN
    bundle = _chart()._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    # no HTML/JavaScript that would fetch Vega from a CDN: the image itself, and the spec
    # under a type no notebook front end renders (the book draws it: book/pages.py)
    assert set(data) == {"image/png", plots.CHART_MIME}
    assert not any(k.startswith(("text/", "application/javascript")) for k in data)
    assert data[plots.CHART_MIME] == _chart().to_dict()
    png = data["image/png"]
    png = base64.b64decode(png) if isinstance(png, str) else png
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_save_writes_svg_and_png(tmp_path):
    plots.save(_chart(), "demo", tmp_path)
    assert (tmp_path / "demo.svg").read_text().lstrip().startswith("<svg")
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"


def test_quick_mode_never_overwrites_the_readme_figures(monkeypatch):
    """The README shows <clone>/figures/*.png; quick runs go to the git-ignored figures/quick."""
    from pathlib import Path

    readme_figures = Path(__file__).resolve().parents[1] / "figures"
    monkeypatch.chdir(readme_figures.parent)
    monkeypatch.delenv("DILOCO_LITE_HOME", raising=False)
    monkeypatch.setenv("DILOCO_LITE_QUICK", "1")
    assert plots.default_figures_dir().resolve() == readme_figures / "quick"
    assert "figures/quick/" in (readme_figures.parent / ".gitignore").read_text()
    monkeypatch.delenv("DILOCO_LITE_QUICK")
    assert plots.default_figures_dir().resolve() == readme_figures


def test_quick_mode_is_the_default_on_colab_and_can_be_turned_off(monkeypatch):
    """A student who opens a notebook from its Colab badge gets quick mode unless they ask."""
    import sys
    import types

    monkeypatch.delenv("DILOCO_LITE_QUICK", raising=False)
    assert not plots.quick_mode()  # a laptop, a lab: full unless asked
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert plots.quick_mode()
    monkeypatch.setenv("DILOCO_LITE_QUICK", "0")
    assert not plots.quick_mode()
    monkeypatch.setenv("DILOCO_LITE_QUICK", "1")
    monkeypatch.delitem(sys.modules, "google.colab")
    assert plots.quick_mode()


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


def test_tables_read_as_the_prose_writes():
    from diloco_lite.plots import tables

    assert tables.number(81920.0) == "81,920" and tables.number(0.8424) == "0.8424"
    assert "e+" not in tables.number(8.192e4) and tables.number(float("nan")) == "–"
    assert tables.percent(0.265) == "26.5%" and tables.points(-0.059) == "-5.9 pp"
    assert tables.nbytes(3_477_504) == "3.48 MB" and tables.nbytes(434_692) == "435 KB"
    assert tables.nbytes(2.09e9) == "2.09 GB" and tables.nbytes(12) == "12 B"
    assert tables.times(233.9) == "234×" and tables.times(0.25) == "0.25×"
    df = pd.DataFrame({"share": [0.5], "bytes": [2048.0], "n": [81920]})
    html = tables.styled(df, percent=["share"], nbytes=["bytes"]).to_html()
    assert all(s in html for s in ("50.0%", "2.05 KB", "81,920"))
    try:
        tables.styled(df, percent=["shares"])
    except ValueError as err:
        assert "column='shares'" in str(err) and "share" in str(err)
    else:
        raise AssertionError("an unknown column must be a ValueError")


def test_legends_name_methods_in_words():
    assert plots.method_label("streaming_diloco") == "Streaming DiLoCo"
    assert plots.method_label("elastic_dp") == "elastic data-parallel"
    assert plots.method_label("decoupled M=8") == "Decoupled DiLoCo M=8"
    assert plots.method_label("something") == "something"
    labels, colors = plots.method_colors(["decoupled_diloco", "ddp"])
    assert labels == ["DDP", "Decoupled DiLoCo"] and colors[0] == plots.PALETTE["ddp"]


def test_end_of_line_labels_do_not_overlap():
    values = [0.58, 0.40, 0.41, 0.12, 0.27]
    placed = plots.spread(values, gap=0.05)
    ranked = sorted(range(len(values)), key=values.__getitem__)
    assert [placed[i] for i in ranked] == sorted(placed)  # order kept
    assert min(np.diff(sorted(placed))) >= 0.05 - 1e-12
    assert plots.spread([0.1, 0.5, 0.9], gap=0.05) == [0.1, 0.5, 0.9]  # far apart: unchanged
