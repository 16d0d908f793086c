"""Notebooks a learner can open and install: the kernelspec JupyterLab expects, and one install
cell whose location is a setting and whose failure is a sentence, not a pip traceback."""

import json
import re
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


@pytest.mark.parametrize("nb", [n for n in NOTEBOOKS if "exercises" not in n.parts
                                and not n.name.startswith("09_")],  # 09: the report
                         ids=lambda n: n.name)
def test_main_notebooks_point_to_their_exercises(nb):
    """Each notebook points to the exercises of its number (04b, 04's experiments, to 04's)."""
    exercise = sorted((ROOT / "notebooks" / "exercises").glob(f"{nb.name[:2]}_*.ipynb"))
    assert exercise, f"{nb.name} has no exercise notebook"
    text = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    assert f"notebooks/exercises/{exercise[0].name}" in text


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


# ---- what the teaching notebooks are allowed to use ------------------------------------------

# The library's machinery: the fast implementation's internals, which a student should not need
# to read. Teaching notebooks use the package (`dl.*`), its documented subpackages (`reference`,
# `wire`, `plots`, `systems`, `distributed`, `actors`, `exercises`) and small public modules.
MACHINERY = ("diloco_lite.algorithms", "diloco_lite.clock.", "diloco_lite.training",
             "diloco_lite.reproduce", "diloco_lite.steps", "diloco_lite.experiments")
TEACHING = sorted((ROOT / "notebooks").rglob("*.py"))  # 09, the report, too: dl.* reads results


def machinery_imports(source: str) -> list[str]:
    """The modules of MACHINERY that `source` imports (`diloco_lite.clock` itself is fine: it is
    the public `Cluster`'s module; its submodules are the planner)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:  # a submodule, or a name of it
            names = [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}")
                     else node.module for a in node.names]
        else:
            continue
        found += [n for n in names if any(
            n.startswith(m) if m.endswith(".") else (n == m or n.startswith(m + "."))
            for m in MACHINERY)]
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_the_machinery_check_finds_planted_imports():
    planted = ("from diloco_lite.clock.plan import make_plan\nfrom diloco_lite import experiments\n"
               "import diloco_lite.training as t\nfrom diloco_lite.algorithms.learners import x\n"
               "from diloco_lite.clock import Cluster\nfrom diloco_lite import reference, wire\n")
    assert machinery_imports(planted) == ["diloco_lite.clock.plan", "diloco_lite.experiments",
                                          "diloco_lite.training", "diloco_lite.algorithms.learners"]


@pytest.mark.parametrize("nb", TEACHING, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_teaching_notebooks_stay_out_of_the_machinery(nb):
    assert len(TEACHING) >= 27
    assert machinery_imports(nb.read_text()) == []


MAIN = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.py"))  # 04b too


@pytest.mark.parametrize("nb", MAIN, ids=lambda p: p.name)
def test_every_notebook_opens_with_a_banner_and_ends_with_takeaways_and_questions(nb):
    text = nb.read_text()
    banner = text[:text.index("# %%\n# Where Colab installs")]
    for part in ("**You will learn**" if not nb.name.startswith("09") else "**What this is",
                 "**You need**", "**Time:**"):
        assert part in banner, (nb.name, part)
    assert "## Takeaways" in text, nb.name
    assert text.count("<details><summary>Answer</summary>") >= 2, nb.name


# Predict first (issue 36): every section of 01–04 that introduces a mechanism asks the reader a
# question before the code answers it, the answer folded in a `<details>` whose `<summary>`
# starts with "Predict" (its Markdown set off by blank lines, so that it renders), and a code
# cell of the same section prints "predicted: …" beside the measured number.
PREDICT_FIRST = {"01_ddp.py": (2, 3, 4, 6, 7),
                 "02_diloco.py": (1, 2, 4, 5, 6, 8),
                 "03_streaming_diloco.py": (1, 2, 3, 4),
                 "04_decoupled_diloco.py": (1, 2, 3, 4, 5, 6)}
PREDICTION = re.compile(r"<details><summary>Predict[^<]*</summary>\n\n\S.*?\S\n\n</details>",
                        re.S)


def notebook_sections(source: str) -> dict[int, tuple[str, str]]:
    """Section number -> (its Markdown, its code), from a jupytext percent source."""
    sections, number = {}, None
    for cell in re.split(r"^# %%", source, flags=re.M)[1:]:
        header, _, body = cell.partition("\n")
        if "[markdown]" in header:
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                             for line in body.splitlines())
            heading = re.search(r"^## (\d+)\. ", text, re.M)
            number = int(heading[1]) if heading else number
            if re.search(r"^## (Takeaways|Check yourself|Exercises)", text, re.M):
                number = None
        if number is not None:
            markdown, code = sections.get(number, ("", ""))
            sections[number] = ((markdown + text, code) if "[markdown]" in header
                                else (markdown, code + body))
    return sections


def missing_predictions(name: str, source: str) -> list[str]:
    sections, missing = notebook_sections(source), []
    for number in PREDICT_FIRST[name]:
        markdown, code = sections.get(number, ("", ""))
        opened = markdown.count("<summary>Predict")
        if not opened or len(PREDICTION.findall(markdown)) != opened:
            missing.append(f"{name} section {number}: no well-formed predict-first <details>")
        elif "predicted" not in code:
            missing.append(f"{name} section {number}: no code cell prints 'predicted'")
    return missing


@pytest.mark.parametrize("name", PREDICT_FIRST)
def test_mechanism_sections_ask_to_predict_first(name):
    assert missing_predictions(name, (ROOT / "notebooks" / name).read_text()) == []


def test_the_predict_first_check_finds_a_planted_removal():
    source = (ROOT / "notebooks" / "01_ddp.py").read_text()
    start = source.index("<details><summary>Predict", source.index("## 3. "))
    end = source.index("</details>", start) + len("</details>")
    assert missing_predictions("01_ddp.py", source[:start] + source[end:]) == [
        "01_ddp.py section 3: no well-formed predict-first <details>"]
    squeezed = source.replace("<summary>Predict first, then open: the answer</summary>\n#\n",
                              "<summary>Predict first, then open: the answer</summary>\n", 1)
    assert missing_predictions("01_ddp.py", squeezed) == [
        "01_ddp.py section 2: no well-formed predict-first <details>"]
