"""The fast lane's time budget (`tests/budget.py`): the overrun check on fake durations against
a plain loop, and the plugin in a real pytest run that a sleeping test pushes over budget."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.budget import DURATIONS, by_file, grown, overrun, part_of, rewritten

ROOT = Path(__file__).resolve().parents[1]

BASE = {"tests/test_a.py::test_1": 2.0, "tests/test_a.py::test_2": 1.0,
        "tests/test_b.py::test_3": 5.0}


def test_within_budget_there_is_no_message():
    entry = {"budget_s": 10.0, "tests": BASE}
    assert overrun("unit", dict(BASE), entry) is None
    assert overrun("unit", {**BASE, "tests/test_b.py::test_3": 7.0}, entry) is None  # 10 s


def test_the_tests_that_grew_are_the_ones_a_plain_loop_finds():
    now = {"tests/test_a.py::test_1": 2.5, "tests/test_a.py::test_2": 0.5,
           "tests/test_b.py::test_3": 9.0, "tests/test_c.py::test_new": 3.0}
    want = []
    for name in now:
        more = now[name] - (BASE[name] if name in BASE else 0.0)
        if more > 0:
            want.append((more, name))
    want.sort(reverse=True)
    assert [(n, pytest.approx(d)) for n, d in grown(now, BASE)] == [(n, d) for d, n in want]
    assert by_file(now) == {"tests/test_a.py": 3.0, "tests/test_b.py": 9.0,
                            "tests/test_c.py": 3.0}


def test_an_overrun_names_the_tests_and_files_that_grew_the_most_first():
    now = {**BASE, "tests/test_b.py::test_3": 45.0, "tests/test_a.py::test_2": 3.0,
           "tests/test_c.py::test_new": 1.5}
    message = overrun("unit", now, {"budget_s": 20.0, "total_s": 8.0, "tests": BASE}, shown=2)
    assert message.startswith("the fast lane's unit took 52 s of test time, over its budget of "
                              "20 s (baseline 8 s")
    lines = message.splitlines()
    tests = lines[lines.index("The tests that grew the most against the baseline:") + 1:][:2]
    assert "+   40.0 s  tests/test_b.py::test_3 (5.0 s -> 45.0 s)" in tests[0]
    assert "tests/test_a.py::test_2 (1.0 s -> 3.0 s)" in tests[1]  # shown=2: test_new left out
    files = lines[lines.index("The files that grew the most against the baseline:") + 1:][:2]
    assert "tests/test_b.py (5.0 s -> 45.0 s)" in files[0]
    assert "tests/test_a.py (3.0 s -> 5.0 s)" in files[1]
    message = overrun("unit", now, {"budget_s": 20.0, "tests": BASE})
    assert "tests/test_c.py::test_new (0.0 s -> 1.5 s)  [new]" in message


def test_the_notebooks_are_one_part_and_the_unit_tests_the_other():
    assert part_of("notebooks/04b_decoupled.ipynb::04b_decoupled.ipynb") == "notebooks"
    assert part_of("tests/test_wire.py::test_bytes[32-shape0-140]") == "unit"


def test_a_rewritten_baseline_keeps_the_budget():
    entry = rewritten({"budget_s": 300, "tests": {"x": 1.0}}, {"y": 2.004, "z": 1.0})
    assert entry == {"budget_s": 300, "total_s": 3.0, "tests": {"y": 2.0, "z": 1.0}}


def test_the_committed_budgets_cover_both_parts_with_headroom():
    data = json.loads(DURATIONS.read_text())
    for part in ("unit", "notebooks"):
        entry = data[part]
        assert entry["tests"] and entry["total_s"] == pytest.approx(
            sum(entry["tests"].values()), abs=1.0)
        assert entry["total_s"] < entry["budget_s"], part


def _run(tmp_path, sleep_s: float, *extra):
    (tmp_path / "test_fake.py").write_text(
        "import time\n"
        "def test_quick():\n    pass\n"
        f"def test_sleepy():\n    time.sleep({sleep_s})\n")
    budget = tmp_path / "durations.json"
    if not budget.exists():
        budget.write_text(json.dumps({"unit": {"budget_s": 0.3, "total_s": 0.0, "tests": {
            "test_fake.py::test_quick": 0.0, "test_fake.py::test_sleepy": 0.0}}}))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.budget",
         f"--rootdir={tmp_path}", f"--time-budget-file={budget}", "test_fake.py", *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # nbmake's import alone takes seconds


def test_a_test_that_sleeps_fails_the_lane_and_is_named(tmp_path):
    run = _run(tmp_path, 0.5, "--time-budget")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    assert "over its budget of 0 s" in run.stdout
    assert "test_fake.py::test_sleepy (0.0 s -> 0.5 s)" in run.stdout
    assert "test_quick" not in run.stdout  # it did not grow
    assert _run(tmp_path, 0.5).returncode == 0  # a run without the option is never checked
    # the baseline rewritten from a run: its budget kept, the sleepy test's second counted
    assert _run(tmp_path, 0.5, "--time-budget", "--time-budget-write").returncode == 0
    entry = json.loads((tmp_path / "durations.json").read_text())["unit"]
    assert entry["budget_s"] == 0.3 and entry["tests"]["test_fake.py::test_sleepy"] >= 0.5
