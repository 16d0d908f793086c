"""Make the blank exercise notebooks from their solutions (`make notebooks-sync` runs it).

A solution notebook (`notebooks/exercises/solutions/NN_*.py`, jupytext percent format) marks
each answer with

    # BEGIN SOLUTION
    ...the answer...
    # END SOLUTION

In the blank copy (`notebooks/exercises/NN_*.py`) an indented block (a function body) becomes
`...`, so the function returns None, and a top-level block keeps only the names it assigns,
as `name = ...`; the checks read both as "not done yet". The title loses " (solutions)" and
links to `exercises/solutions/` point to `exercises/`. Everything else is copied, so the two
notebooks never drift apart.

    python -m diloco_lite.exercises.blank [ROOT]     # rewrite every blank notebook's .py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
_ASSIGNED = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*(?:\s*,\s*[A-Za-z_][A-Za-z_0-9]*)*)\s*=[^=]")


def blank_source(text: str) -> str:
    """The blank notebook's text for a solution notebook's text."""
    out: list[str] = []
    block: list[str] | None = None
    indent = ""
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if block is not None:
                raise ValueError(f"line {number}: {BEGIN} inside another solution block")
            block, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if block is None:
                raise ValueError(f"line {number}: {END} without {BEGIN}")
            out += _placeholder(block, indent)
            block = None
        elif block is not None:
            block.append(line)
        else:
            out.append(line)
    if block is not None:
        raise ValueError(f"{BEGIN} never closed by {END}")
    blank = "".join(out).replace(" (solutions)", "")
    return blank.replace("notebooks/exercises/solutions/", "notebooks/exercises/")


def _placeholder(block: list[str], indent: str) -> list[str]:
    if indent:  # inside a function: no answer, the function returns None
        return [f"{indent}...\n"]
    names = [m[1] for line in block if (m := _ASSIGNED.match(line))]
    return [f"{name} = ...\n" for name in dict.fromkeys(names)] or ["...\n"]


def sync(root: Path) -> list[Path]:
    """Rewrite `notebooks/exercises/*.py` from `notebooks/exercises/solutions/*.py`."""
    folder = root / "notebooks" / "exercises"
    written = []
    for solution in sorted((folder / "solutions").glob("*.py")):
        target = folder / solution.name
        target.write_text(blank_source(solution.read_text(encoding="utf-8")), encoding="utf-8")
        written.append(target)
    return written


if __name__ == "__main__":
    for path in sync(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print("wrote", path)
