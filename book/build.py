"""`make book`: the course as a static website under build/book/html, offline.

Four steps: run the notebooks (or take them from the cache `make test` filled: book/execute.py),
stage the pages (build/book/src: the README as the landing page, the executed notebooks, the
blank exercises, docs/, the reference's source), rewrite what only works on GitHub (links
between repository files become links between pages; remote images become links; charts become
interactive: book/pages.py), and run Sphinx (book/conf.py).

    python -m book.build            # quick mode (DILOCO_LITE_QUICK=1), 2 notebooks at a time
    python -m book.build --full     # the full runs, from make reproduce's run cache
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from . import execute, pages

ROOT = execute.ROOT
BUILD = ROOT / "build" / "book"
# the longest first, so that two workers finish together
ORDER = ["01", "02", "04", "03", "04b", "05", "06", "00", "09"]
# the notebooks that start processes of their own (07: jax.distributed, 08: a Ray cluster) run
# after the others, one at a time: beside another notebook on 2 cores, Ray's node can time out
# while it starts. (make test-rest runs them alone too, and the book then reuses those runs.)
ALONE = ["07", "08"]


def course() -> list[Path]:
    """The notebooks of the series, 00 to 09 (04b included), in reading order."""
    found = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no notebooks under {ROOT / 'notebooks'}")
    return found


def exercises() -> list[Path]:
    """The blank exercise notebooks (never their solutions)."""
    return sorted((ROOT / "notebooks" / "exercises").glob("[0-9][0-9]*_*.ipynb"))


def _rank(nb: Path) -> int:
    number = nb.name.split("_")[0]
    return ORDER.index(number) if number in ORDER else len(ORDER)


def _report(nb: Path, result, k: int, total: int, start: float, done: dict) -> None:
    try:
        done[nb.name] = result()
    except execute.NotebookError as error:  # the build stops, naming the cell
        raise SystemExit(f"[book] {nb.name} failed:\n{error}") from None
    print(f"[book] {k}/{total} {nb.name} ran ({time.time() - start:.0f} s so far)", flush=True)


def run_all(notebooks: list[Path], workers: int = 2) -> dict[str, Path]:
    """Each notebook executed (or its cached copy for the inputs as they are now)."""
    done, todo = {}, []
    for nb in notebooks:
        hit = execute.cached(nb)
        if hit is not None:
            done[nb.name] = hit
        else:
            todo.append(nb)
    print(f"[book] {len(done)} notebooks cached, {len(todo)} to run "
          f"({workers} at a time): {' '.join(nb.stem.split('_')[0] for nb in todo) or '-'}",
          flush=True)
    start = time.time()
    alone = [nb for nb in todo if nb.name.split("_")[0] in ALONE]
    pool = ProcessPoolExecutor(max_workers=max(1, workers))
    try:
        futures = {pool.submit(execute.execute, nb): nb
                   for nb in sorted(set(todo) - set(alone), key=_rank)}
        for k, future in enumerate(as_completed(futures), 1):
            _report(futures[future], future.result, k, len(todo), start, done)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for k, nb in enumerate(alone, len(todo) - len(alone) + 1):
        _report(nb, lambda nb=nb: execute.execute(nb), k, len(todo), start, done)
    return {nb.name: done[nb.name] for nb in notebooks}


def stage(executed: dict[str, Path], src: Path) -> None:
    """Write the book's source tree: every page, its links rewritten for the book."""
    if src.exists():
        shutil.rmtree(src)
    (src / "notebooks").mkdir(parents=True)
    (src / "exercises").mkdir()
    (src / "docs").mkdir()
    (src / "reference").mkdir()
    site = pages.Site(ROOT, src)
    site.write_markdown(ROOT / "README.md", src / "index.md",
                        extra=pages.toctree(executed, pages.docs(ROOT)))
    site.write_markdown(ROOT / "notebooks" / "README.md", src / "notebooks" / "README.md")
    for doc in pages.docs(ROOT):
        site.write_markdown(doc, src / "docs" / doc.name)
    for name, path in executed.items():
        site.write_notebook(path, src / "notebooks" / name, ROOT / "notebooks" / name)
    for ex in exercises():
        site.write_notebook(ex, src / "exercises" / ex.name, ex)
    site.write_markdown(ROOT / "figures" / "results.md", src / "results.md")
    (src / "exercises" / "index.md").write_text(pages.exercises_index(exercises()))
    modules = pages.reference_modules(ROOT)
    (src / "reference" / "index.md").write_text(pages.reference_index(ROOT, modules))
    for module in modules:
        (src / "reference" / f"{module.stem}.md").write_text(pages.source_page(module, ROOT))
    # the figures, for Markdown images (src/figures) and the README's raw <img> (_extra: copied
    # as they are to the site's root, where index.html's "figures/x.png" points)
    for folder in (src / "figures", src / "_extra" / "figures"):
        folder.mkdir(parents=True)
        for png in (ROOT / "figures").glob("*.png"):
            shutil.copy2(png, folder / png.name)
    shutil.copy2(ROOT / "book" / "conf.py", src / "conf.py")  # its paths are the staged tree's
    (src / "_static").mkdir(exist_ok=True)
    (src / "_static" / "vega-bundle.js").write_text(pages.vega_bundle())
    shutil.copy2(ROOT / "book" / "book.css", src / "_static" / "book.css")


def sphinx(src: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
           "-d", str(BUILD / "doctrees"), str(src), str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m book.build", description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true",
                    help="the full-size notebooks (their runs from make reproduce's cache)")
    ap.add_argument("--workers", type=int, default=2, help="notebooks run at once (default 2)")
    ap.add_argument("--out", type=Path, default=BUILD / "html")
    args = ap.parse_args(argv)
    if args.workers < 1:
        raise SystemExit(f"--workers must be at least 1, got {args.workers}")
    os.environ["DILOCO_LITE_QUICK"] = "0" if args.full else "1"
    try:
        import myst_nb  # noqa: F401
        import sphinx_book_theme  # noqa: F401
    except ImportError as err:
        raise SystemExit(f"{err.name} is missing: the book needs the `book` extra "
                         "(pip install -e '.[dev,book]'; make book installs it)") from None
    start = time.time()
    executed = run_all(course(), args.workers)
    stage(executed, BUILD / "src")
    sphinx(BUILD / "src", args.out)
    count = sum(1 for _ in args.out.rglob("*.html"))
    print(f"[book] {count} pages in {args.out} ({time.time() - start:.0f} s); "
          f"open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
