"""The fast lane's time budget: a pytest plugin that `make test` loads (`-p tests.budget`).

With `--time-budget` it adds up each test's setup + call + teardown seconds (on the controller
when pytest-xdist runs the tests) in two parts, `unit` (tests/) and `notebooks` (the notebooks
run as tests), and compares each part's sum with its `budget_s` in `tests/durations.json`. Over
budget, the session fails with a message naming the tests and the files that grew the most
against their committed baseline seconds (a test missing from the baseline counts as new: it
grew from 0). Without the option it does nothing: `make test-rest`, the Colab lane and a
subset run by hand are never checked.

`make test-durations` runs the fast lane with `--time-budget-write` as well, which rewrites
both parts' baselines (each test's seconds and their total) and keeps their `budget_s`: a
budget is a decision, set by hand in the JSON, not a measurement.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
SHOWN = 5  # tests and files named in an overrun message
NOISE_S = 0.1  # growth below this is not named


def pytest_addoption(parser):
    group = parser.getgroup("time budget (make test)")
    group.addoption("--time-budget", action="store_true", default=False,
                    help="fail when a part's (unit, notebooks) summed test seconds exceed its "
                         "budget_s in tests/durations.json, naming the tests that grew")
    group.addoption("--time-budget-write", action="store_true", default=False,
                    help="with --time-budget: write this run's seconds as the baselines")
    group.addoption("--time-budget-file", default=str(DURATIONS),
                    help="the JSON file of budgets and baselines (default tests/durations.json)")


def pytest_configure(config):
    if config.getoption("time_budget") and not hasattr(config, "workerinput"):  # the controller
        config.pluginmanager.register(   # (or a run without xdist)
            BudgetCheck(Path(config.getoption("time_budget_file")),
                        config.getoption("time_budget_write")), "diloco_lite_time_budget")


# ---- the logic, on plain dicts (tests/test_budget.py checks it on fake durations) ------------

def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def part_of(nodeid: str) -> str:
    return "notebooks" if file_of(nodeid).endswith(".ipynb") else "unit"


def grown(seconds: dict[str, float], baseline: dict[str, float],
          more_than: float = 0.0) -> list[tuple[str, float]]:
    """(name, seconds more than its baseline) of every name that grew by more than `more_than`
    seconds, the most first."""
    out = [(name, s - baseline.get(name, 0.0)) for name, s in seconds.items()]
    return sorted([(n, d) for n, d in out if d > more_than], key=lambda x: (-x[1], x[0]))


def by_file(seconds: dict[str, float]) -> dict[str, float]:
    out = defaultdict(float)
    for nodeid, s in seconds.items():
        out[file_of(nodeid)] += s
    return dict(out)


def overrun(part: str, seconds: dict[str, float], entry: dict, shown: int = SHOWN) -> str | None:
    """None within budget; else the message: the total against the budget, then the tests and
    files that grew the most against the baseline (`entry`: PART's object in durations.json)."""
    total, budget = sum(seconds.values()), float(entry["budget_s"])
    if total <= budget:
        return None
    base = entry.get("tests", {})
    lines = [f"the fast lane's {part} took {total:.0f} s of test time, over its budget of "
             f"{budget:.0f} s (baseline {entry.get('total_s', sum(base.values())):.0f} s, "
             f"tests/durations.json)."]
    for title, now, then in (("tests", seconds, base), ("files", by_file(seconds), by_file(base))):
        top = grown(now, then, NOISE_S)[:shown]
        if top:
            lines.append(f"The {title} that grew the most against the baseline:")
            lines += [f"  +{d:7.1f} s  {name} ({then.get(name, 0.0):.1f} s -> {now[name]:.1f} s)"
                      + ("  [new]" if name not in then else "") for name, d in top]
    lines.append("Make them faster (a smaller config where the property holds at any size), or "
                 "mark the inherently slow ones `slow` (docs/testing.md); `make test-durations` "
                 "rewrites the baseline.")
    return "\n".join(lines)


def rewritten(entry: dict, seconds: dict[str, float]) -> dict:
    """PART's entry with this run as its baseline; its budget kept."""
    return {"budget_s": entry.get("budget_s", round(1.3 * sum(seconds.values()))),
            "total_s": round(sum(seconds.values()), 1),
            "tests": {k: round(v, 2) for k, v in sorted(seconds.items())}}


# ---- the plugin -------------------------------------------------------------------------------

class BudgetCheck:
    def __init__(self, path: Path, write: bool):
        self.path, self.write = path, write
        self.seconds: dict[str, float] = defaultdict(float)
        self.lines: list[str] = []
        self.over = False

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration  # setup, call and teardown

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        parts = {part: {k: v for k, v in self.seconds.items() if part_of(k) == part}
                 for part in ("unit", "notebooks")}
        for part, seconds in parts.items():
            if not seconds:
                continue
            entry = data.get(part, {})
            if self.write:
                data[part] = rewritten(entry, seconds)
                self.lines.append(f"wrote {part}'s baseline to {self.path}: "
                                  f"{data[part]['total_s']:.0f} s of test time, "
                                  f"budget {data[part]['budget_s']} s")
                continue
            if "budget_s" not in entry:
                raise pytest.UsageError(f"--time-budget: {self.path} has no budget for {part}")
            message = overrun(part, seconds, entry)
            self.over |= message is not None
            self.lines.append(message or f"{part}: {sum(seconds.values()):.0f} s of test time, "
                                         f"within its budget of {entry['budget_s']:.0f} s")
        if self.write:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
        elif self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        if self.lines:
            terminalreporter.section("time budget", sep="=", red=self.over, bold=self.over)
            for line in self.lines:
                terminalreporter.write_line(line, red=line.startswith("the fast lane"))
