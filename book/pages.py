"""The book's pages from the repository's files: what works on GitHub, rewritten for a website.

- A link between repository files becomes a link between the book's pages (README.md -> the
  landing page, docs/X.md -> docs/X, notebooks/N.ipynb -> its executed page, a reference module
  -> its source page); a link to a file the book has no page for goes to the file on GitHub.
- A remote image (the Colab badge) becomes a plain link: the book loads nothing from outside.
- A chart's output carries its Vega-Lite spec beside the PNG (plots.CHART_MIME, one renderer for
  every front end); here the spec replaces the PNG and is drawn by the Vega bundled into the
  site, so the chart responds to the mouse.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

from diloco_lite.plots import CHART_MIME

GITHUB = "https://github.com/diloco-lite/diloco_lite"
BOOK = "https://diloco-lite.github.io/diloco_lite/"  # where .github/workflows/book.yml publishes
LINK = re.compile(r"(\]\()([^)\s]+)(\))")  # [text](target)
ATTR = re.compile(r"""((?:src|href)=")([^"]+)(")""")  # <img src="...">, <a href="...">
BADGE = re.compile(r"\[!\[([^\]]*)\]\((https?://[^)]*)\)\]\(([^)]*)\)")  # [![alt](img)](url)
REMOTE_IMAGE = re.compile(r"!\[([^\]]*)\]\((https?://[^)]*)\)")


def docs(root: Path) -> list[Path]:
    return sorted((root / "docs").glob("*.md"))


def reference_modules(root: Path) -> list[Path]:
    folder = root / "diloco_lite" / "reference"
    return sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")


class Site:
    """Where each repository file lives in the book, and the rewriting of links to it."""

    def __init__(self, root: Path, src: Path):
        self.root, self.src = root, src  # the repository, the staged book (build.stage)
        pages = {"README.md": "index.md", "notebooks/README.md": "notebooks/README.md",
                 "figures/results.md": "results.md",
                 "notebooks/exercises": "exercises/index.md",
                 "diloco_lite/reference": "reference/index.md"}
        for nb in (root / "notebooks").glob("[0-9]*_*.ipynb"):
            for suffix in (".ipynb", ".py"):
                pages[f"notebooks/{nb.stem}{suffix}"] = f"notebooks/{nb.name}"
        for nb in (root / "notebooks" / "exercises").glob("[0-9]*_*.ipynb"):
            for suffix in (".ipynb", ".py"):
                pages[f"notebooks/exercises/{nb.stem}{suffix}"] = f"exercises/{nb.name}"
        for doc in docs(root):
            pages[f"docs/{doc.name}"] = f"docs/{doc.name}"
        for module in reference_modules(root):
            pages[f"diloco_lite/reference/{module.name}"] = f"reference/{module.stem}.md"
        self.pages = pages

    def target(self, link: str, source: str, page: str) -> str:
        """`link`, written in repository file `source`, as seen from book page `page`."""
        if link.startswith(BOOK):  # the README's "read" links: within the book, relative
            target = link[len(BOOK):].partition("#")
            book = target[0].removesuffix(".html") or "index"
            for suffix in (".md", ".ipynb"):
                if book + suffix in self.pages.values():
                    return posixpath.relpath(book + suffix, posixpath.dirname(page) or ".") + \
                        target[1] + target[2]
            return link
        if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("#"):
            return link  # a URL (https:, mailto:) or an anchor on the same page
        path, hash_, anchor = link.partition("#")
        repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path)).rstrip("/")
        if repo.startswith("figures/") and repo.endswith(".png"):
            book = repo  # copied beside the pages (build.stage)
        elif repo in self.pages:
            book = self.pages[repo]
        else:  # a file the book has no page for: on GitHub
            kind = "tree" if (self.root / repo).is_dir() else "blob"
            return f"{GITHUB}/{kind}/main/{repo}{hash_}{anchor}"
        return posixpath.relpath(book, posixpath.dirname(page) or ".") + hash_ + anchor

    def markdown(self, text: str, source: str, page: str) -> str:
        text = BADGE.sub(r"[\1](\3)", text)
        text = REMOTE_IMAGE.sub(r"[\1](\2)", text)

        def fix(m):
            return m.group(1) + self.target(m.group(2), source, page) + m.group(3)
        return ATTR.sub(fix, LINK.sub(fix, text))

    def write_markdown(self, path: Path, out: Path, extra: str = "") -> None:
        source = str(path.relative_to(self.root))
        page = out.relative_to(self.src).as_posix()
        out.write_text(self.markdown(path.read_text(), source, page) + extra)

    def write_notebook(self, path: Path, out: Path, repo_path: Path) -> None:
        nb = json.loads(path.read_text())
        source = str(repo_path.relative_to(self.root))
        page = out.relative_to(self.src).as_posix()
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                text = "".join(cell["source"])
                cell["source"] = self.markdown(text, source, page)
            for output in cell.get("outputs", []):
                if CHART_MIME in output.get("data", {}):
                    output["data"] = {"text/html": chart_html(output["data"][CHART_MIME])}
                    output.get("metadata", {}).pop("image/png", None)
        out.write_text(json.dumps(nb, indent=1))


_charts = 0


def chart_html(spec: dict) -> str:
    """A Vega-Lite spec drawn in the page by the bundled vegaEmbed (book/conf.py loads it)."""
    global _charts
    _charts += 1
    name = f"dl-chart-{_charts}"
    data = json.dumps(spec).replace("</", "<\\/")
    return (f'<div class="dl-chart" id="{name}"></div>\n'
            f'<script type="application/json" id="{name}-spec">{data}</script>\n'
            f'<script>dlChart("{name}");</script>\n')


def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed in one script, from vl-convert (no download), plus
    `dlChart(id)`, which draws the spec stored beside the chart's div."""
    import vl_convert

    draw = """
window.dlChart = function (name) {
  const spec = JSON.parse(document.getElementById(name + "-spec").textContent);
  window.vegaEmbed("#" + name, spec, {actions: false, renderer: "svg"})
    .then(() => document.getElementById(name).setAttribute("data-drawn", "1"))
    .catch((error) => console.error("chart " + name + ": " + error));
};
"""
    # in a function's scope: the bundle's top-level names (`_`, ...) would clash with Sphinx's
    return "(() => {\n" + vl_convert.javascript_bundle() + "\n})();\n" + draw


def toctree(executed: dict, doc_pages: list[Path]) -> str:
    """The site's navigation: the course, the exercises, the docs, the reference."""
    def tree(caption, entries):
        return ("\n```{toctree}\n:hidden:\n:caption: " + caption + "\n\n"
                + "\n".join(entries) + "\n```\n")
    return ("\n" + tree("The course", [f"notebooks/{Path(n).stem}" for n in executed])
            + tree("Exercises", ["exercises/index"])
            + tree("Docs", [f"docs/{d.stem}" for d in doc_pages]
                   + ["notebooks/README", "results"])
            + tree("The reference", ["reference/index"]))


def exercises_index(exercises: list[Path]) -> str:
    lines = ["# Exercises", "",
             "Each notebook of the course has an exercise notebook: `TODO` cells where you write "
             "the key lines, each followed by a check that prints ✔ or names the mistake. These "
             "pages are the blank notebooks, as a student gets them; run them in JupyterLab or "
             f"on Colab. The solutions are [in the repository]({GITHUB}/tree/main/notebooks/"
             "exercises/solutions) for teachers.", ""]
    lines += ["```{toctree}", ":maxdepth: 1", ""] + [ex.stem for ex in exercises] + ["```", ""]
    return "\n".join(lines)


def reference_index(root: Path, modules: list[Path]) -> str:
    init = (root / "diloco_lite" / "reference" / "__init__.py").read_text()
    doc = re.match(r'\s*"""(.*?)"""', init, re.S)
    lines = ["# The reference", "",
             "Each method in plain JAX on one device: the specification the fast library is "
             "tested equal to. Notebooks 02, 03 and 04 build these programs step by step.", ""]
    if doc:
        lines += ["```text", doc.group(1).strip(), "```", ""]
    lines += ["```{toctree}", ":maxdepth: 1", ""] + [m.stem for m in modules] + ["```", ""]
    return "\n".join(lines)


def source_page(module: Path, root: Path) -> str:
    """A reference module as a page: its path, a link to it on GitHub, its highlighted source."""
    repo = module.relative_to(root).as_posix()
    code = module.read_text()
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", code)), default=0))
    return (f"# `{repo}`\n\n"
            f"The source as it is in the repository ([on GitHub]({GITHUB}/blob/main/{repo})), "
            f"{len(code.splitlines())} lines.\n\n"
            f"{fence}python\n{code}{fence}\n")
