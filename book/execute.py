"""Executed notebooks, cached by what produced them: the tests that run the notebooks (make test)
write here, and the book reads from here, so a notebook runs once per change, not twice.

The key is a hash of every input a notebook's outputs depend on: the notebook itself, every file
of the `diloco_lite` package, the committed results 09 reads (`figures/*.json`, `figures/*.csv`),
this file (how they are run), the settings that change what a notebook shows (SETTINGS), and the
Python and JAX versions. Change any of them and the cached copy no longer matches: a cached
output never outlives the code that produced it. (jupyter-cache, myst-nb's own cache, keys on
the notebook's code cells only, so a change in the library would leave a stale page.)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "executed"
# the settings that change what a notebook shows (quick mode, the device count, where the run
# cache and the data live); not the tests' own variables
SETTINGS = ("DILOCO_LITE_QUICK", "DILOCO_LITE_DEVICES", "DILOCO_LITE_HOME",
            "DILOCO_LITE_RUNS_DIR", "DILOCO_LITE_DATA_DIR")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookError(RuntimeError):
    """A cell raised: the message names the notebook, the cell and the error."""


def _inputs() -> list[Path]:
    package = [p for p in sorted((ROOT / "diloco_lite").rglob("*"))
               if p.is_file() and "__pycache__" not in p.parts]
    results = sorted(p for ext in ("json", "csv") for p in (ROOT / "figures").glob(f"*.{ext}"))
    return package + results + [Path(__file__)]  # and how it runs them (this file)


def key(notebook: str | Path) -> str:
    """The hash of everything the notebook's outputs depend on (see the module docstring)."""
    h = hashlib.sha256()
    notebook = Path(notebook).resolve()
    for path in [notebook, *_inputs()]:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        h.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")
    settings = {k: os.environ.get(k) for k in SETTINGS}
    h.update(json.dumps([sorted(settings.items()), platform.python_version(),
                         version("jax")]).encode())
    return h.hexdigest()[:20]


def cached(notebook: str | Path, cache: Path = CACHE, stamp: str | None = None) -> Path | None:
    """The executed copy of `notebook` for the inputs as they are now (their key: `stamp`,
    computed when not given), or None."""
    path = cache / f"{Path(notebook).stem}.ipynb"
    if path.exists() and json.loads(path.read_text())["metadata"].get(
            "diloco_lite_key") == (stamp or key(notebook)):
        return path
    return None


def execute(notebook: str | Path, cache: Path = CACHE, timeout: int = 900,
            reuse: bool = True) -> Path:
    """Run `notebook` top to bottom in a fresh python3 kernel (its folder as the working
    directory), save the executed copy under `cache` with its key; return its path. With
    `reuse`, a cached copy for the same key is returned without running anything (the book);
    the tests always run (reuse=False). Raises NotebookError, naming the cell."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = Path(notebook).resolve()
    stamp = key(notebook)  # before running: what ran is what the key describes
    hit = cached(notebook, cache, stamp) if reuse else None
    if hit is not None:
        return hit
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}},
                            # the kernel's own log (a warning about TCP on localhost) is noise
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])
    saved = os.environ.get("DILOCO_LITE_PROGRESS")
    os.environ["DILOCO_LITE_PROGRESS"] = "0"  # the kernel inherits it: no progress bars
    try:
        client.execute()
    except CellExecutionError as error:
        raise NotebookError(f"{notebook.name}: {ANSI.sub('', str(error))}") from None
    finally:
        if saved is None:
            os.environ.pop("DILOCO_LITE_PROGRESS", None)
        else:
            os.environ["DILOCO_LITE_PROGRESS"] = saved
    nb.metadata["diloco_lite_key"] = stamp
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{notebook.stem}.ipynb"
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(out)  # atomic: a reader never sees half a notebook
    return out


if __name__ == "__main__":  # python -m book.execute NOTEBOOK...: run (or reuse) each
    for name in sys.argv[1:]:
        print(execute(name))
