"""The book's pieces (book/): links rewritten for the website, charts made interactive, the
executed-notebook cache keyed by what produced it, and the checks of the built site (broken
links, and in Chromium: outside requests, console errors, undrawn charts, error outputs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from book import execute, pages
from book.browser import broken_links
from diloco_lite.plots import CHART_MIME

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def site(tmp_path):
    return pages.Site(ROOT, tmp_path / "src")


@pytest.mark.parametrize("link, source, page, want", [
    # between repository files -> between pages, relative to the page
    ("docs/testing.md", "README.md", "index.md", "docs/testing.md"),
    ("docs/reproduction.md#results", "README.md", "index.md", "docs/reproduction.md#results"),
    ("algorithms.md#symbols", "docs/design.md", "docs/design.md", "algorithms.md#symbols"),
    ("../README.md", "docs/testing.md", "docs/testing.md", "../index.md"),
    ("notebooks/02_diloco.ipynb", "README.md", "index.md", "notebooks/02_diloco.ipynb"),
    ("../notebooks/02_diloco.ipynb", "docs/notebooks.md", "docs/notebooks.md",
     "../notebooks/02_diloco.ipynb"),
    ("../notebooks/exercises/", "docs/notebooks.md", "docs/notebooks.md", "../exercises/index.md"),
    ("exercises/03_streaming_diloco.ipynb", "notebooks/03_streaming_diloco.ipynb",
     "notebooks/03_streaming_diloco.ipynb", "../exercises/03_streaming_diloco.ipynb"),
    ("../diloco_lite/reference/diloco.py", "notebooks/02_diloco.ipynb",
     "notebooks/02_diloco.ipynb", "../reference/diloco.md"),
    ("figures/quality.png", "README.md", "index.md", "figures/quality.png"),
    ("../figures/quality.png", "docs/reproduction.md", "docs/reproduction.md",
     "../figures/quality.png"),
    # what the book has no page for: on GitHub (a folder as a tree)
    ("data/README.md", "README.md", "index.md",
     f"{pages.GITHUB}/blob/main/data/README.md"),
    ("../notebooks/exercises/solutions/", "docs/notebooks.md", "docs/notebooks.md",
     f"{pages.GITHUB}/tree/main/notebooks/exercises/solutions"),
    # the book's own address (the README's "read" links): relative, within the book
    (f"{pages.BOOK}notebooks/01_ddp.html", "README.md", "index.md", "notebooks/01_ddp.ipynb"),
    (pages.BOOK, "docs/design.md", "docs/design.md", "../index.md"),
    # URLs and same-page anchors as they are
    ("https://arxiv.org/abs/2311.08105", "README.md", "index.md",
     "https://arxiv.org/abs/2311.08105"),
    ("#results", "README.md", "index.md", "#results"),
])
def test_links_between_files_become_links_between_pages(site, link, source, page, want):
    assert site.target(link, source, page) == want


def test_remote_images_become_links_and_raw_images_follow_the_page(site):
    text = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            "(https://colab.research.google.com/github/x/y.ipynb) and "
            "![a shield](https://img.shields.io/badge/x.svg) and "
            '<img src="../figures/quality.png" width="180">')
    out = site.markdown(text, "docs/reproduction.md", "docs/reproduction.md")
    assert "](https://colab.research.google.com/assets" not in out and "![" not in out
    assert "[Open In Colab](https://colab.research.google.com/github/x/y.ipynb)" in out
    assert "[a shield](https://img.shields.io/badge/x.svg)" in out
    assert '<img src="../figures/quality.png" width="180">' in out


def test_a_chart_output_becomes_the_interactive_chart(tmp_path, site):
    import altair as alt
    import pandas as pd

    from diloco_lite import plots

    plots.enable()
    chart = alt.Chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_line().encode(x="x", y="y")
    bundle, _ = chart._repr_mimebundle_()
    assert set(bundle) == {"image/png", CHART_MIME}  # the PNG for JupyterLab, Colab, GitHub
    assert bundle[CHART_MIME]["mark"]["type"] == "line"
    bundle["image/png"] = "iVBORw0K"  # as a notebook stores it: base64 text
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [
        {"output_type": "display_data", "data": bundle, "metadata": {"image/png": {}}}]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    src = tmp_path / "src"
    (src / "notebooks").mkdir(parents=True)
    (tmp_path / "in.ipynb").write_text(json.dumps(nb))
    site.write_notebook(tmp_path / "in.ipynb", src / "notebooks" / "x.ipynb",
                        ROOT / "notebooks" / "00_emulated_devices.ipynb")
    out = json.loads((src / "notebooks" / "x.ipynb").read_text())["cells"][0]["outputs"][0]
    assert list(out["data"]) == ["text/html"]
    html = out["data"]["text/html"]
    name = html.split('id="')[1].split('"')[0]
    spec = html.split(f'id="{name}-spec">')[1].split("</script>")[0]
    assert json.loads(spec.replace("<\\/", "</")) == json.loads(json.dumps(bundle[CHART_MIME]))
    assert f'dlChart("{name}")' in html


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A small repository: the package, a committed result, a notebook, a README."""
    for path, text in {"diloco_lite/a.py": "x = 1\n", "diloco_lite/sub/b.py": "y = 2\n",
                       "figures/results.json": "[]", "figures/quality.png": "png",
                       "notebooks/n.ipynb": "{}", "README.md": "hi",
                       "tests/test_a.py": ""}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    monkeypatch.setattr(execute, "ROOT", tmp_path)
    monkeypatch.delenv("DILOCO_LITE_QUICK", raising=False)
    return tmp_path


@pytest.mark.parametrize("change, stale", [
    ("diloco_lite/sub/b.py", True), ("figures/results.json", True),
    ("notebooks/n.ipynb", True), ("README.md", False), ("tests/test_a.py", False),
    ("figures/quality.png", False),
])
def test_the_cache_key_changes_with_what_the_outputs_depend_on(tree, change, stale):
    before = execute.key(tree / "notebooks" / "n.ipynb")
    (tree / change).write_text((tree / change).read_text() + " ")
    assert (execute.key(tree / "notebooks" / "n.ipynb") != before) == stale


def test_the_cache_key_changes_with_quick_mode_not_with_other_variables(tree, monkeypatch):
    nb = tree / "notebooks" / "n.ipynb"
    before = execute.key(nb)
    monkeypatch.setenv("DILOCO_LITE_TEST_OWNER", "someone")
    assert execute.key(nb) == before
    monkeypatch.setenv("DILOCO_LITE_QUICK", "1")
    assert execute.key(nb) != before


def _notebook(path: Path, *sources: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def test_a_notebook_runs_once_and_its_copy_is_kept_until_it_changes(tree, tmp_path):
    nb = _notebook(tree / "notebooks" / "n.ipynb", "print(6 * 7)")
    cache = tmp_path / "cache"
    assert execute.cached(nb, cache) is None
    out = execute.execute(nb, cache)
    cell = json.loads(out.read_text())["cells"][0]
    assert "".join(cell["outputs"][0]["text"]) == "42\n"
    assert execute.cached(nb, cache) == out
    (tree / "diloco_lite" / "a.py").write_text("x = 2\n")  # the library changed
    assert execute.cached(nb, cache) is None


def test_a_failing_cell_is_named(tree, tmp_path):
    nb = _notebook(tree / "notebooks" / "n.ipynb", "a = 1", "b = a / 0")
    with pytest.raises(execute.NotebookError, match=r"(?s)n\.ipynb.*b = a / 0.*ZeroDivision"):
        execute.execute(nb, tmp_path / "cache")
    assert not (tmp_path / "cache" / "n.ipynb").exists()


def test_make_tests_notebook_runner_fails_a_failing_notebook_and_keeps_a_passing_one(tmp_path):
    import subprocess
    import sys

    good = _notebook(tmp_path / "good.ipynb", "x = 1")
    bad = _notebook(tmp_path / "bad.ipynb", "x = 1", "raise ValueError('planted')")
    cache = tmp_path / "cache"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.notebooks_run", "-p",
         "no:cacheprovider", f"--notebook-cache={cache}", str(good), str(bad)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-2000:]
    assert "ValueError: planted" in run.stdout and "raise ValueError('planted')" in run.stdout
    assert (cache / "good.ipynb").exists() and not (cache / "bad.ipynb").exists()


def _fake_site(root: Path, pages_: dict[str, str], head: str = "") -> Path:
    for rel, body in pages_.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"<html><head>{head}</head><body>{body}</body></html>")
    return root


def test_broken_internal_links_and_anchors_are_found(tmp_path):
    site = _fake_site(tmp_path, {
        "index.html": '<a href="docs/a.html#there">ok</a> <a href="docs/a.html#nowhere">x</a>'
                      '<a href="docs/gone.html">y</a> <a href="https://example.org/x">out</a>'
                      '<a href="#top">ok</a><h1 id="top">t</h1>',
        "docs/a.html": '<section id="there"></section><a href="../index.html#top">ok</a>'
                       '<a href="../index.html#missing">z</a>',
    })
    assert sorted(broken_links(site)) == [
        "docs/a.html: ../index.html#missing (no anchor #missing on index.html)",
        "index.html: docs/a.html#nowhere (no anchor #nowhere on docs/a.html)",
        "index.html: docs/gone.html (no such page)",
    ]


@pytest.mark.slow
def test_the_browser_check_catches_what_a_reader_would_see_go_wrong(tmp_path, monkeypatch):
    pytest.importorskip("playwright")
    if shutil.which("chromium") is None:
        pytest.skip("no chromium: make chromium installs it")
    from book import browser

    spec = {"data": {"values": [{"x": 1, "y": 2}, {"x": 2, "y": 1}]}, "mark": "line",
            "encoding": {"x": {"field": "x", "type": "quantitative"},
                         "y": {"field": "y", "type": "quantitative"}}}
    good = pages.chart_html(spec)
    site = _fake_site(tmp_path, {
        "index.html": good + '<a href="bad.html">bad</a>',
        "bad.html": '<img src="https://example.org/x.png"><img src="missing.png">'
                    '<script>console.error("boom")</script><div class="dl-chart" id="c9"></div>'
                    '<div class="cell_output"><div class="output traceback">ValueError: no'
                    '</div></div>',
    }, head='<script src="/vega.js"></script>')
    (site / "vega.js").write_text(pages.vega_bundle())
    monkeypatch.setattr(browser, "INTERACTIONS", {})  # the book's own pages are not here
    problems = browser.check(site, timeout_s=5, progress=None)
    assert not [p for p in problems if p.startswith("index.html")], problems
    bad = [p.split(": ", 1)[1] for p in problems if p.startswith("bad.html")]
    assert any(p.startswith("outside request: https://example.org/x.png") for p in bad), bad
    assert any("missing.png" in p for p in bad), bad  # 404 and not loaded
    assert "console error: boom" in bad
    assert "chart not drawn: #c9" in bad
    assert any(p.startswith("error output: ValueError: no") for p in bad), bad
