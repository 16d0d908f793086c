"""pytest runs the notebooks named on its command line (`-p tests.notebooks_run`), one test each,
and keeps each executed copy for the book (book/execute.py): make test runs a notebook, make
book shows that run instead of running it again. Like nbmake, a notebook passes when every cell
runs without raising; the failure report is the failing cell and its traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from book.execute import CACHE, NotebookError, execute


def pytest_addoption(parser):
    parser.addoption("--notebook-timeout", type=int, default=900,
                     help="seconds a notebook's cell may run (default 900)")
    parser.addoption("--notebook-cache", default=str(CACHE),
                     help=f"where the executed copies go (default {CACHE})")


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".ipynb":
        return NotebookFile.from_parent(parent, path=file_path)
    return None


class NotebookFile(pytest.File):
    def collect(self):
        yield NotebookItem.from_parent(self, name=self.path.name)


class NotebookItem(pytest.Item):
    def runtest(self):
        execute(self.path, cache=Path(self.config.getoption("notebook_cache")),
                timeout=self.config.getoption("notebook_timeout"), reuse=False)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, NotebookError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, f"notebook {self.path.name}"
