"""`make notebooks-sync`: every `.ipynb` from its `.py` source, so that git and JupyterLab see
no change that nobody made.

1. The blank exercise notebooks are written from their solutions (`exercises.blank`).
2. Every `notebooks/**/*.py` (jupytext percent format) becomes its `.ipynb`, outputs empty.
3. The metadata JupyterLab adds when a kernel connects is written up front: the kernel's
   `language_info` (of the Python that runs the sync, i.e. the project's venv). Without it,
   merely opening a notebook modifies it and JupyterLab asks to save it. (The kernelspec comes
   from the `.py` header: "Python 3 (ipykernel)", the display name ipykernel installs.)
4. Cell ids are derived from the notebook's name and the cell's position; jupytext draws random
   ones, which would rewrite every `.ipynb` at every sync.

    python -m diloco_lite.notebook_sync [ROOT]
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def render(source: Path) -> str:
    """The `.ipynb` text for a jupytext `.py` source."""
    import jupytext
    import nbformat

    nb = jupytext.read(source)
    nb.metadata.get("jupytext", {}).pop("text_representation", None)  # the .py's, as jupytext
    nb.metadata["language_info"] = language_info()
    for i, cell in enumerate(nb.cells):
        cell.id = hashlib.sha1(f"{source.stem}:{i}".encode()).hexdigest()[:8]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(nb) + "\n"


def language_info() -> dict:
    """What ipykernel reports for this Python (JupyterLab copies it into the notebook)."""
    from ipykernel.ipkernel import IPythonKernel

    return json.loads(json.dumps(IPythonKernel.language_info))  # a plain copy


def sync(root: Path) -> list[Path]:
    """Write the blank exercises, then every notebook's `.ipynb`; return the files changed."""
    from .exercises import blank

    blank.sync(root)
    changed = []
    sources = (root / "notebooks").rglob("*.py")
    for source in sorted(p for p in sources if ".ipynb_checkpoints" not in p.parts):
        target = source.with_suffix(".ipynb")
        text = render(source)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            changed.append(target)
    return changed


if __name__ == "__main__":
    for path in sync(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print("wrote", path)
