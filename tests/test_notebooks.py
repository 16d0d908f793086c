"""Notebooks a learner can open and install: the kernelspec JupyterLab expects, and one install
cell whose location is a setting and whose failure is a sentence, not a pip traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)  # JupyterLab's copies
# Notebooks 02 and 03 get the install cell and the link to their exercises with their driver
# rewrite (same pattern); remove them from here then.


def _install_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "".join(cells[1]["source"])


def test_kernelspec_is_the_one_ipykernel_installs():
    """JupyterLab rewrites a kernelspec whose display name differs from the kernel's, and then
    asks to save a notebook nobody edited."""
    from ipykernel.kernelspec import get_kernel_dict

    want = {"name": "python3", "display_name": get_kernel_dict()["display_name"],
            "language": "python"}
    assert len(NOTEBOOKS) >= 18
    for nb in NOTEBOOKS:
        assert json.loads(nb.read_text())["metadata"]["kernelspec"] == want, nb.name


def test_every_notebook_installs_the_same_way():
    cells = {nb.relative_to(ROOT): _install_cell(nb) for nb in NOTEBOOKS}
    first = next(iter(cells.values()))
    assert first.count("REPO = ") == 1 and "git+{REPO}" in first
    assert all(cell == first for cell in cells.values()), [
        str(p) for p, c in cells.items() if c != first]


def test_a_failed_install_says_what_to_do(tmp_path):
    """On a fake Colab, a REPO that cannot be installed ends the cell with a clear message."""
    cell = _install_cell(ROOT / "notebooks" / "00_emulated_devices.ipynb")
    missing = tmp_path / "diloco_lite-0.0.0-py3-none-any.whl"
    default = 'REPO = "https://github.com/diloco-lite/diloco_lite"'
    assert default in cell
    cell = cell.replace(default, f"REPO = {str(missing)!r}")
    code = ("import sys, types, importlib.util\n"
            "sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
            "importlib.util.find_spec = lambda name, *a: None\n" + cell)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1
    assert "Could not install diloco_lite from" in run.stderr and str(missing) in run.stderr
    assert "Set REPO above to your fork's URL" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("nb", [n for n in NOTEBOOKS if "exercises" not in n.parts],
                         ids=lambda n: n.name)
def test_main_notebooks_point_to_their_exercises(nb):
    exercise = ROOT / "notebooks" / "exercises" / nb.name
    assert exercise.exists(), f"{nb.name} has no exercise notebook"
    text = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    assert f"notebooks/exercises/{nb.name}" in text


def test_committed_notebooks_are_exactly_what_the_sync_writes():
    """Stable cell ids and the kernel's language_info: JupyterLab opens them unmodified (it
    adds language_info when a kernel connects), and a re-sync rewrites nothing."""
    from diloco_lite.notebook_sync import render

    def without_python_version(text):
        nb = json.loads(text)
        assert nb["metadata"]["language_info"]["name"] == "python"
        nb["metadata"]["language_info"].pop("version")
        return nb

    for nb in NOTEBOOKS:
        fresh = render(nb.with_suffix(".py"))
        assert without_python_version(nb.read_text()) == without_python_version(fresh), (
            f"{nb.name} differs from its .py: run `make notebooks-sync`")
