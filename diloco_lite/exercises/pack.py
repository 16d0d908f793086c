"""The student pack (`make student-pack`): the blank exercise notebooks as `.ipynb`, without
solutions or outputs, and a short README, in one folder ready to hand out.

The blanks are made afresh from the solution notebooks (`blank.blank_source`, then the same
rendering as `make notebooks-sync`), so the pack never holds a stale or solved notebook; it is
refused if a solution block survived.

    python -m diloco_lite.exercises pack [FOLDER] [--root REPO]     # build/student-pack/
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .blank import BEGIN, END, blank_source

README = """\
# diloco_lite exercises

One notebook per chapter of the course: `00_emulated_devices.ipynb` goes with notebook 00 of
diloco_lite, and so on to `08_actors.ipynb`. Work through the chapter's notebook first, then
its exercises, in order.

## Running them

- **Colab**: upload a notebook (File → Upload notebook) and run it top to bottom; its first
  cell installs diloco_lite.
- **Your machine**: install diloco_lite (`pip install -e ".[dev]"` in a clone of the
  repository), then `jupyter lab` in this folder.

Every notebook runs from top to bottom even before you answer anything: an exercise that is
not done yet says so.

## How the checks work

Each exercise ends with a check, a `check_...` call that runs your answer on a small problem
and prints one line:

- `✔ title: ...` your answer is right;
- `✘ title: not done yet: ...` the answer is still the blank `...`;
- `✘ title: ...` what is wrong, and where to look. When your answer matches a classic mistake,
  the check names it ("the grace window is counted from the wrong instant"); it never prints
  the expected formula.

An error in your code becomes a sentence, not a traceback. Change your answer and run the cell
again, as often as you like. Cells marked "Predict before you run" ask you to guess first, then
run your own functions on a new case.

## For teachers

Grade a returned notebook with

    python -m diloco_lite.exercises grade 04_decoupled_diloco.ipynb

It runs the notebook in a fresh kernel (quick mode; `--full` for full mode, `--timeout S` per
cell), prints one line per exercise (pass, or fail with the named mistake, or "not run") and a
summary, and exits with 0 only when every exercise passes and no cell raised (1 otherwise; 2
when the file cannot be graded). A renamed notebook: add `--notebook 04`.
"""


def blank_notebooks(root: Path) -> dict[str, str]:
    """name.ipynb -> its blank notebook's text, made from `root`'s solution notebooks."""
    from ..notebook_sync import render

    solutions = sorted((root / "notebooks" / "exercises" / "solutions").glob("*.py"))
    if not solutions:
        raise ValueError(f"no solution notebooks under {root / 'notebooks/exercises/solutions'}")
    out = {}
    with tempfile.TemporaryDirectory(prefix="diloco_lite_pack_") as tmp:
        for solution in solutions:
            source = Path(tmp) / solution.name  # same stem: the same cell ids as the repository's
            source.write_text(blank_source(solution.read_text(encoding="utf-8")),
                              encoding="utf-8")
            text = render(source)
            if BEGIN in text or END in text:
                raise ValueError(f"{solution.name}: a solution block survived the blanking")
            out[solution.with_suffix(".ipynb").name] = text
    return out


def write_pack(root: Path, folder: Path) -> list[Path]:
    """Write the pack into `folder` (its old notebooks and README replaced); return the files."""
    notebooks = blank_notebooks(Path(root))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.ipynb"), folder / "README.md"]:
        if old.is_file():
            old.unlink()
    written = []
    for name, text in notebooks.items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    (folder / "README.md").write_text(README, encoding="utf-8")
    return [*written, folder / "README.md"]
