"""Where diloco_lite writes its outputs: next to the learner, never inside the installed package.

`figures/`, `runs/` and `data/cache/` all live under one folder, `project_root()`:

1. `$DILOCO_LITE_HOME`, when set;
2. else the nearest folder, from the working directory upward, that holds this project's
   `pyproject.toml` (a clone: running a notebook from `notebooks/` writes to the clone's
   `figures/`, as `make reproduce` does);
3. else the working directory itself (Colab: `/content/figures`, `/content/runs`, ...).

A non-editable install (Colab's `pip install --no-deps git+...`) would otherwise write into
site-packages, where the learner never looks. The finer variables (`$DILOCO_LITE_RUNS_DIR`,
`$DILOCO_LITE_DATA_DIR`) still win for their own folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HOME_ENV = "DILOCO_LITE_HOME"
_OUR_PYPROJECT = re.compile(r'^name\s*=\s*"diloco[_-]lite"', re.MULTILINE)


def project_root(start: str | Path | None = None) -> Path:
    """The folder outputs go under (see the module docstring); `start` defaults to the cwd."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser().resolve()
    here = Path(start if start is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if _is_our_project(folder / "pyproject.toml"):
            return folder
    return here


def figures_dir(quick: bool = False) -> Path:
    """`<root>/figures`, or the git-ignored `<root>/figures/quick` for quick (CI-sized) runs."""
    out = project_root() / "figures"
    return out / "quick" if quick else out


def runs_dir(quick: bool = False) -> Path:
    """`$DILOCO_LITE_RUNS_DIR` or `<root>/runs` (`/quick` for quick runs): cached histories."""
    base = Path(os.environ.get("DILOCO_LITE_RUNS_DIR") or project_root() / "runs")
    return base / "quick" if quick else base


def data_cache_dir() -> Path:
    """`$DILOCO_LITE_DATA_DIR` or `<root>/data/cache`: the processed corpus."""
    return Path(os.environ.get("DILOCO_LITE_DATA_DIR") or project_root() / "data" / "cache")


def _is_our_project(pyproject: Path) -> bool:
    try:
        return bool(_OUR_PYPROJECT.search(pyproject.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError):
        return False
