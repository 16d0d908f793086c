"""The teacher's grader (`python -m diloco_lite.exercises grade NB.ipynb`) and the student pack
(`make student-pack`): what they print, their exit status, and what the pack may not hold."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from diloco_lite import exercises as ex
from diloco_lite.exercises import blank, grade, pack
from diloco_lite.exercises._core import FAIL_MARK, PASS_MARK, RECORD_ENV

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "notebooks" / "exercises"
SOLUTIONS = sorted((EXERCISES / "solutions").glob("*.py"))


def _grade(*args, cwd=ROOT, timeout=900):
    return subprocess.run([sys.executable, "-m", "diloco_lite.exercises", "grade", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def _checks_called(solution: Path) -> list[str]:
    """The checks a solution notebook calls, in order (read with ast, not a regex)."""
    calls = []
    for node in ast.walk(ast.parse(solution.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "").startswith("check_"):
            calls.append((node.lineno, node.func.id))
    return [name for _, name in sorted(calls)]


def test_the_grader_knows_every_notebooks_exercises():
    """NOTEBOOKS, the grader's table, is the checks each solution notebook calls, in order."""
    assert list(grade.NOTEBOOKS) == [p.stem for p in SOLUTIONS]
    for solution in SOLUTIONS:
        assert list(grade.NOTEBOOKS[solution.stem]) == _checks_called(solution), solution.name
    assert {c for cs in grade.NOTEBOOKS.values() for c in cs} == set(ex.CHECKS)


@pytest.mark.parametrize("bad, says", [
    ("missing.ipynb", "no such file"),
    ("README.md", "is not a Jupyter notebook"),
    ("notebooks", "not a file"),
    ("bad.ipynb", "is not a Jupyter notebook"),
    ("invalid.ipynb", "is not a Jupyter notebook"),
])
def test_bad_input_is_a_sentence_and_exit_status_2(bad, says, tmp_path):
    (tmp_path / "bad.ipynb").write_text('{"cells": 3}')
    (tmp_path / "invalid.ipynb").write_text(json.dumps(  # JSON of version 4, a cell without source
        {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}))
    path = {"missing.ipynb": tmp_path / "missing.ipynb", "bad.ipynb": tmp_path / "bad.ipynb",
            "invalid.ipynb": tmp_path / "invalid.ipynb",
            "README.md": ROOT / "README.md", "notebooks": ROOT / "notebooks"}[bad]
    run = _grade(path, timeout=120)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and "Traceback" not in run.stderr + run.stdout


def test_a_notebook_is_recognised_by_name_by_its_checks_or_by_flag(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from diloco_lite.exercises import check_gather_bytes, check_sync_time")])
    assert grade.which(Path("04_decoupled_diloco.ipynb"), nb) == "04_decoupled_diloco"
    assert grade.which(Path("05_bandwidth_alice.ipynb"), nb) == "05_bandwidth"
    assert grade.which(Path("alice.ipynb"), nb) == "07_real_links"
    assert grade.which(Path("alice.ipynb"), nb, "08") == "08_actors"
    with pytest.raises(grade.Unusable, match="pass --notebook"):
        grade.which(Path("alice.ipynb"), nbformat.v4.new_notebook())
    with pytest.raises(grade.Unusable, match="expected one of"):
        grade.which(Path("alice.ipynb"), nb, "42")


def test_the_report_names_each_exercise_and_fails_on_anything_missing():
    """From the verdicts the checks recorded: pass, fail with the named mistake, not run; a
    cell that raised fails the notebook even when every exercise passed."""
    name = "05_bandwidth"
    found = {"check_ddp_bandwidth": dict(ok=False, mistake="no_ring", message="reread the ring")}
    lines, status = grade.report(name, found, [])
    assert lines == [f"{FAIL_MARK} 05.1 DDP bandwidth: fail (no_ring) — reread the ring",
                     f"{FAIL_MARK} 05.2 Decoupled DiLoCo bandwidth: not run",
                     "0 of 2 exercises pass; 2 fail or did not run"]
    assert status == 1
    both = {c: dict(ok=True, mistake=None, message="") for c in grade.NOTEBOOKS[name]}
    assert grade.report(name, both, [])[1] == 0
    lines, status = grade.report(name, both, ["cell 4 raised NameError: x"])
    assert status == 1 and "! cell 4 raised NameError: x" in lines
    todo = {"check_ddp_bandwidth": dict(ok=False, mistake="todo", message="not done yet: ...")}
    assert grade.report(name, todo, [])[0][0] == f"{FAIL_MARK} 05.1 DDP bandwidth: fail (todo)"


def test_a_check_records_its_verdict_where_the_grader_says(tmp_path, monkeypatch, capsys):
    record = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv(RECORD_ENV, str(record))
    ex.check_cluster_mtbf(365.25 * 86400 / 1.2e6)
    ex.check_cluster_mtbf(365.25 * 24 / 1.2e6)
    capsys.readouterr()
    items = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(i["check"], i["ok"], i["mistake"]) for i in items] == [
        ("check_cluster_mtbf", True, None), ("check_cluster_mtbf", False, "hours")]
    assert grade.verdicts(record)["check_cluster_mtbf"]["mistake"] == "hours"  # the last one
    monkeypatch.delenv(RECORD_ENV)
    ex.check_cluster_mtbf(1.0)
    assert len(record.read_text().splitlines()) == 2  # no variable, no record


def _lines(run) -> list[str]:
    return [line for line in run.stdout.splitlines() if line.startswith((PASS_MARK, FAIL_MARK))]


@pytest.mark.slow
def test_grading_the_blank_04_fails_every_exercise_as_todo():
    run = _grade(EXERCISES / "04_decoupled_diloco.ipynb")
    assert run.returncode == 1, run.stdout + run.stderr
    lines = _lines(run)
    assert len(lines) == len(grade.NOTEBOOKS["04_decoupled_diloco"]) == 5
    assert all(line.startswith(FAIL_MARK) and line.endswith("fail (todo)") for line in lines)
    assert "0 of 5 exercises pass" in run.stdout


@pytest.mark.slow
def test_grading_the_solved_04_passes_every_exercise():
    run = _grade(EXERCISES / "solutions" / "04_decoupled_diloco.ipynb")
    assert run.returncode == 0, run.stdout + run.stderr
    assert [line.split(":")[0] for line in _lines(run)] == [
        f"{PASS_MARK} 04.{n} {ex.CHECKS[c][0]}"
        for n, c in enumerate(grade.NOTEBOOKS["04_decoupled_diloco"], 1)]
    assert "5 of 5 exercises pass" in run.stdout


@pytest.mark.slow
def test_a_student_notebook_with_a_wrong_answer_an_error_and_a_deleted_check(tmp_path):
    """Notebook 05 solved, then: exercise 1 answered with the classic no-ring mistake, a cell
    that raises, exercise 2's check deleted. Named mistake, the error, "not run", exit 1."""
    nb = nbformat.read(EXERCISES / "solutions" / "05_bandwidth.ipynb", as_version=4)
    for cell in nb.cells:
        if "def ddp_bandwidth" in cell.source:
            cell.source = cell.source.replace("2 * (replicas - 1) / replicas", "1")
        if "check_decoupled_bandwidth(b_decoupled" in cell.source:
            cell.source = re.sub(r"decoupled_ok = check_decoupled_bandwidth\(.*?\)\n?", "",
                                 cell.source, flags=re.S) + "\ndecoupled_ok = False\n"
    nb.cells.insert(4, nbformat.v4.new_code_cell("1 / 0"))
    path = tmp_path / "alice.ipynb"
    nbformat.write(nb, path)
    run = _grade(path, "--notebook", "05")
    assert run.returncode == 1, run.stdout + run.stderr
    assert _lines(run) == [f"{FAIL_MARK} 05.1 DDP bandwidth: fail (no_ring) — "
                           + next(s for k, _, s in _ddp_mistakes() if k == "no_ring"),
                           f"{FAIL_MARK} 05.2 Decoupled DiLoCo bandwidth: not run"]
    assert "! cell 5 raised ZeroDivisionError" in run.stdout


def _ddp_mistakes():
    """The DDP bandwidth check's named mistakes, read from its source: (key, _, sentence)."""
    source = (ROOT / "diloco_lite" / "exercises" / "systems.py").read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple) and len(node.elts) == 3 and isinstance(
                node.elts[0], ast.Constant) and node.elts[0].value == "no_ring":
            found.append(("no_ring", None, ast.literal_eval(node.elts[2])))
    return found


# ---- the student pack ---------------------------------------------------------------------


def solution_only_lines(solution_text: str) -> set[str]:
    """The code lines of a solution notebook's answers that appear nowhere else in it."""
    inside, answer, rest = False, set(), set()
    for line in solution_text.splitlines():
        stripped = line.strip()
        if stripped == blank.BEGIN:
            inside = True
        elif stripped == blank.END:
            inside = False
        elif stripped and not stripped.startswith("#"):
            (answer if inside else rest).add(stripped)
    return {line for line in answer - rest if len(line) > 6}


def _pack_code(text: str) -> set[str]:
    nb = json.loads(text)
    return {line.strip() for c in nb["cells"] if c["cell_type"] == "code"
            for line in "".join(c["source"]).splitlines()}


def _unversioned(text):
    nb = json.loads(text)
    nb["metadata"]["language_info"].pop("version", None)
    return nb


def test_the_student_pack_holds_every_blank_notebook_and_no_solution(tmp_path):
    folder = tmp_path / "student-pack"
    (folder).mkdir()
    (folder / "stale.ipynb").write_text("{}")  # an older pack's leftover goes
    written = pack.write_pack(ROOT, folder)
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([p.with_suffix(".ipynb").name for p in SOLUTIONS] + ["README.md"])
    assert sorted(written) == sorted(folder.iterdir())
    for solution in SOLUTIONS:
        text = (folder / solution.with_suffix(".ipynb").name).read_text()
        assert blank.BEGIN not in text and blank.END not in text and "(solutions)" not in text
        secret = solution_only_lines(solution.read_text())
        assert secret, solution.name
        assert not secret & _pack_code(text), (solution.name, secret & _pack_code(text))
        nb = json.loads(text)
        assert all(c["outputs"] == [] and c["execution_count"] is None
                   for c in nb["cells"] if c["cell_type"] == "code")
        # the same notebook the repository hands out as the blank one (up to the Python
        # version the sync records, which is the running interpreter's)
        assert _unversioned(text) == _unversioned(
            (EXERCISES / solution.with_suffix(".ipynb").name).read_text())
        # ... and the check above would catch the solved one
        solved = (EXERCISES / "solutions" / solution.with_suffix(".ipynb").name).read_text()
        assert secret & _pack_code(solved)
    readme = (folder / "README.md").read_text()
    assert "python -m diloco_lite.exercises grade" in readme and "✘" in readme


def test_the_pack_refuses_a_solution_that_survives_blanking(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "blank_source", lambda text: text)  # a broken blanker
    with pytest.raises(ValueError, match="survived"):
        pack.write_pack(ROOT, tmp_path)


def test_make_student_pack_is_a_target():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^student-pack: \$\(STAMP\)\n\t\$\(PY\) -m diloco_lite\.exercises pack "
                     r"build/student-pack$", makefile, re.M)
    assert re.search(r"^\.PHONY:.*\bstudent-pack\b", makefile, re.M)
    assert re.search(r"^build/$", (ROOT / ".gitignore").read_text(), re.M)
