"""The built book, opened page by page in headless Chromium (Debian's `chromium`; `make chromium`
installs it) from a local server: what a reader would see go wrong.

A page fails on: a console error or an uncaught exception; a request to anything but the local
server (the book must work offline: it is answered with an abort, and named); a request that
fails or answers 4xx/5xx; an image that does not load; a chart that does not draw (an
interactive chart's div gets data-drawn="1" once vegaEmbed has drawn it, with an <svg> inside);
math that MathJax did not typeset or typeset as an error; a notebook cell with an error output;
on the pages of INTERACTIONS, no chart that responds to the mouse (a slider, a legend click, a
tooltip).
Every internal link (`<a href>` to a page of the book, with its #anchor) must point to a page
and an anchor that exist: that is read from the HTML files, no browser needed.

    python -m book.browser [build/book/html]   # exit 1 and a list of problems, or "ok"
"""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
SKIP = {"genindex.html", "search.html"}  # Sphinx's own: nothing of ours on them


class _Page(HTMLParser):
    """The ids (anchors) of one HTML page and the links in it."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name not in SKIP
                  and not p.relative_to(site).parts[0].startswith("_"))


def broken_links(site: Path) -> list[str]:
    """Each internal link whose page or anchor does not exist: 'page: href (why)'."""
    parsed: dict[Path, _Page] = {}

    def parse(path: Path) -> _Page:
        if path not in parsed:
            parsed[path] = _Page()
            parsed[path].feed(path.read_text(errors="replace"))
        return parsed[path]

    problems = []
    for page in pages(site):
        for href in parse(page).links:
            url = urlparse(href)
            if url.scheme or url.netloc or href.startswith("mailto:"):
                continue  # outside the book: a link, not a request
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            where = f"{page.relative_to(site)}: {href}"
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{where} (no such page)")
            elif url.fragment and target.suffix == ".html" and \
                    unquote(url.fragment) not in parse(target).ids:
                problems.append(f"{where} (no anchor #{url.fragment} on "
                                f"{target.relative_to(site)})")
    return problems


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(site: Path):
    """A local server of `site` on 127.0.0.1 (a free port), in a thread: (server, base URL)."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


PAGE_CHECKS = """() => {
  const out = [];
  for (const img of document.images)
    if (!img.complete || img.naturalWidth === 0) out.push("image not loaded: " + img.src);
  for (const chart of document.querySelectorAll(".dl-chart"))
    if (chart.getAttribute("data-drawn") !== "1" || !chart.querySelector("svg"))
      out.push("chart not drawn: #" + chart.id);
  for (const err of document.querySelectorAll(".cell_output .output.traceback, .output.error"))
    out.push("error output: " + err.textContent.trim().split("\\n").slice(-1)[0].slice(0, 200));
  if (document.querySelector(".math") && !document.querySelector("mjx-container"))
    out.push("math not typeset");
  for (const bad of document.querySelectorAll("mjx-merror"))
    out.push("math error: " + bad.textContent.slice(0, 120));
  return out;
}"""
SETTLED = """() => {
  const charts = [...document.querySelectorAll(".dl-chart")];
  const drawn = charts.every(c => c.getAttribute("data-drawn") === "1");
  const math = !document.querySelector(".math") || !!document.querySelector("mjx-container");
  return document.readyState === "complete" && drawn && math;
}"""


# Charts that must respond to the mouse, by page: how (book/build.py makes charts interactive)
INTERACTIONS = {
    "notebooks/05_bandwidth.html": ("slider", "tooltip"),
    "notebooks/02_diloco.html": ("legend", "tooltip"),
}
ON_LINES = """(chart) => {  // points on the chart's first lines, in page coordinates
  return [...chart.querySelectorAll("g.mark-line path")].slice(0, 4).flatMap(path => {
    const m = path.getScreenCTM(), n = path.getTotalLength();
    return [0.2, 0.35, 0.5, 0.65, 0.8].map(f => {
      const p = path.getPointAtLength(n * f);
      return [p.x * m.a + p.y * m.c + m.e, p.x * m.b + p.y * m.d + m.f];
    });
  });
}"""


def responds(page, how: str) -> str | None:
    """None when some chart on `page` reacts to `how` (a slider moved, a legend entry clicked,
    the mouse over a line), else what did not happen."""
    charts = page.locator(".dl-chart")
    for i in range(charts.count()):
        chart = charts.nth(i)
        chart.scroll_into_view_if_needed()
        before = chart.inner_html()
        if how == "slider":
            slider = chart.locator("input[type=range]")
            if not slider.count():
                continue
            slider.first.evaluate("(el) => { el.value = el.min; "
                                  "el.dispatchEvent(new Event('input', {bubbles: true})); }")
        elif how == "legend":
            entry = chart.locator("g.role-legend-label text")
            if not entry.count():
                continue
            entry.first.click(force=True, timeout=5000)
        elif how == "tooltip":
            for xy in chart.evaluate(ON_LINES):  # a 1-pixel stroke: try a few points
                page.mouse.move(*xy, steps=3)
                page.wait_for_timeout(150)
                if page.locator("#vg-tooltip-element.visible").count():
                    page.mouse.move(0, 0)
                    return None
            continue
        page.wait_for_timeout(400)
        if chart.inner_html() != before:
            return None
    return f"no chart responds to the {how}"


def _watch(page, base: str) -> list[str]:
    """What goes wrong on `page` while it loads, appended to the list returned."""
    found: list[str] = []

    def route(r):
        if r.request.url.startswith((base, "data:")):
            r.continue_()
        else:  # offline: nothing may come from outside the book's folder
            found.append(f"outside request: {r.request.url}")
            r.abort()

    def console(m):
        if m.type == "error":
            found.append(f"console error: {m.text[:300]}")

    def failed(r):
        if r.url.startswith(base):
            found.append(f"request failed: {r.url}")

    def response(r):
        if r.status >= 400:
            found.append(f"HTTP {r.status}: {r.url}")

    page.route("**/*", route)
    page.on("console", console)
    page.on("pageerror", lambda e: found.append(f"exception: {e}"))
    page.on("requestfailed", failed)
    page.on("response", response)
    return found


def check(site: Path, timeout_s: float = 20.0, progress=print) -> list[str]:
    """Every problem on every page of the built book at `site`; [] when it is all fine."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise FileNotFoundError("no `chromium` on PATH: `make chromium` installs Debian's")
    problems = broken_links(site)
    problems += [f"{rel}: missing (its charts must respond to the mouse)"
                 for rel in INTERACTIONS if not (site / rel).exists()]
    server, base = serve(site)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            for k, page_path in enumerate(pages(site), 1):
                rel = page_path.relative_to(site).as_posix()
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                found = _watch(page, base)
                page.goto(urljoin(base, rel), wait_until="load")
                try:
                    page.wait_for_function(SETTLED, timeout=timeout_s * 1000)
                except PlaywrightTimeout:
                    pass  # PAGE_CHECKS names what did not settle
                found += page.evaluate(PAGE_CHECKS)
                for how in INTERACTIONS.get(rel, ()):
                    if (failure := responds(page, how)) is not None:
                        found.append(failure)
                page.close()
                problems += [f"{rel}: {f}" for f in dict.fromkeys(found)]
                if progress:
                    progress(f"[book] {k:2d} {rel}: {'ok' if not found else len(found)}")
            browser.close()
    finally:
        server.shutdown()
    return problems


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    site = Path(argv[0] if argv else "build/book/html")
    if not (site / "index.html").exists():
        print(f"{site} has no index.html: build the book first (make book)", file=sys.stderr)
        return 2
    problems = check(site)
    for line in problems:
        print(line)
    print(f"[book] {len(pages(site))} pages opened: "
          f"{'ok' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
