"""Grade a student's exercise notebook: run it, read every check's verdict, print one line per
exercise and a summary.

    python -m diloco_lite.exercises grade 04_decoupled_diloco.ipynb
    python -m diloco_lite.exercises grade alice.ipynb --notebook 04 --timeout 900 --full

The notebook runs in a fresh kernel (nbclient), in quick mode (`DILOCO_LITE_QUICK=1`) unless
`--full`, each cell within `--timeout` seconds, going on past a cell that raises. Every check
appends its verdict to the file `$DILOCO_LITE_GRADE_RECORD` names (`_core.record`), so the
grader reads the verdicts themselves, not the printed lines. Which exercises a notebook has is
`NOTEBOOKS` (held to the solution notebooks by the tests); the notebook is recognised by its
file name (`04_...`), else by the checks it imports, else by `--notebook NN`.

Exit status: 0 when every exercise passes and no cell raised; 1 when an exercise fails, was
not run (its check never printed a verdict) or a cell raised; 2 when the notebook cannot be
graded at all (no such file, not a notebook, a kernel that does not start).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from ._core import FAIL_MARK, PASS_MARK, RECORD_ENV, TODO

# notebook -> its checks, in the order the notebook calls them
NOTEBOOKS: dict[str, tuple[str, ...]] = {
    "00_emulated_devices": ("check_global_max", "check_allreduce_bytes", "check_mean_loss"),
    "01_ddp": ("check_ddp_gradient", "check_ddp_step_bytes"),
    "02_diloco": ("check_pseudo_gradient", "check_outer_step", "check_next_round",
                  "check_diloco_loop"),
    "03_streaming_diloco": ("check_quantizer", "check_wire_bytes", "check_mix",
                            "check_streaming_round"),
    "04_decoupled_diloco": ("check_token_weights", "check_close_time", "check_syncer",
                            "check_rda_merge", "check_run_goodput"),
    "05_bandwidth": ("check_ddp_bandwidth", "check_decoupled_bandwidth"),
    "06_goodput": ("check_cluster_mtbf", "check_young_interval", "check_daly_interval",
                   "check_domain_goodput"),
    "07_real_links": ("check_gather_bytes", "check_sync_time"),
    "08_actors": ("check_apply_position", "check_kill_goodput", "check_kill_timing"),
}
NOT_RUN = "not run"


class Unusable(Exception):
    """The notebook cannot be graded (exit status 2)."""


def read_notebook(path: Path):
    """The notebook at `path` (nbformat 4), or `Unusable` with a sentence."""
    import nbformat

    if not path.exists():
        raise Unusable(f"no such file: {path}")
    if not path.is_file():
        raise Unusable(f"not a file: {path}")
    try:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
    except Exception as err:  # JSON, encoding, schema: all mean "not a notebook"
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise Unusable(f"{path} is not a Jupyter notebook ({first})") from None
    return nb


def which(path: Path, nb, override: str | None = None) -> str:
    """The exercise notebook `path` is: `override` (NN or a name), its file name, or the checks
    its code imports."""
    def by_prefix(text: str) -> str | None:
        hits = [name for name in NOTEBOOKS if text == name or text[:2] == name[:2]]
        return hits[0] if len(hits) == 1 else None

    if override:
        found = by_prefix(override.strip())
        if found is None:
            raise Unusable(f"--notebook {override!r}: expected one of "
                           f"{', '.join(n[:2] for n in NOTEBOOKS)}")
        return found
    match = re.match(r"(\d\d)(?:_|\b)", path.stem)
    if match and (found := by_prefix(match[1])):
        return found
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    used = set(re.findall(r"\bcheck_[a-z_]+\b", source))
    best = max(NOTEBOOKS, key=lambda n: len(used & set(NOTEBOOKS[n])))
    if not used & set(NOTEBOOKS[best]):
        raise Unusable(f"cannot tell which exercise notebook {path.name} is (it calls no "
                       "check): pass --notebook NN")
    return best


def execute(nb, folder: Path, record: Path, *, timeout: float, quick: bool) -> list[str]:
    """Run `nb` in a fresh kernel, in `folder`; the checks append their verdicts to `record`.
    Returns what went wrong, one sentence per cell that raised (or the run's end)."""
    from nbclient import NotebookClient

    saved = {k: os.environ.get(k) for k in (RECORD_ENV, "DILOCO_LITE_QUICK")}
    os.environ[RECORD_ENV] = str(record)
    if quick:
        os.environ["DILOCO_LITE_QUICK"] = "1"
    problems = []
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    except Exception as err:  # a cell past its timeout, a kernel that died or never started
        kind = type(err).__name__
        if "Timeout" in kind:
            problems.append(f"a cell ran past the {timeout:g} s timeout: the run stopped there")
        elif "DeadKernel" in kind:
            problems.append("the kernel died: the run stopped there")
        elif not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"):
            raise Unusable(f"the notebook could not run ({kind}: "
                           f"{(str(err).splitlines() or [''])[0][:160]})") from None
        else:
            problems.append(f"the run stopped: {kind}")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    for number, cell in enumerate(nb.cells, 1):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error":
                problems.append(f"cell {number} raised {out.get('ename')}: "
                                f"{str(out.get('evalue', ''))[:160]}")
    return problems


def verdicts(record: Path) -> dict[str, dict]:
    """check name -> its last verdict in the record file."""
    found: dict[str, dict] = {}
    if record.exists():
        for line in record.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            found[item.get("check", "")] = item
    return found


def report(name: str, found: dict[str, dict], problems: list[str]) -> tuple[list[str], int]:
    """The lines the grader prints, and its exit status (0: all pass, 1: not)."""
    from . import CHECKS

    lines, passed = [], 0
    for number, check in enumerate(NOTEBOOKS[name], 1):
        title = CHECKS[check][0]
        label = f"{name[:2]}.{number} {title}"
        item = found.get(check)
        if item is None:
            lines.append(f"{FAIL_MARK} {label}: {NOT_RUN}")
        elif item.get("ok"):
            passed += 1
            lines.append(f"{PASS_MARK} {label}: pass")
        else:
            mistake = item.get("mistake") or "other"
            hint = "" if mistake == TODO else f" — {item.get('message', '')}"
            lines.append(f"{FAIL_MARK} {label}: fail ({mistake}){hint}")
    lines += [f"! {problem}" for problem in problems]
    total = len(NOTEBOOKS[name])
    summary = f"{passed} of {total} exercises pass"
    if total - passed:
        summary += f"; {total - passed} fail or did not run"
    if problems:
        summary += f"; {len(problems)} problem(s) running the notebook"
    lines.append(summary)
    return lines, 0 if passed == total and not problems else 1


def grade(path: Path, *, notebook: str | None = None, timeout: float = 600.0,
          quick: bool = True, out=sys.stdout) -> int:
    """Grade the notebook at `path`; print the lines; return the exit status."""
    try:
        nb = read_notebook(path)
        name = which(path, nb, notebook)
        print(f"grading {path} as {name} ({'quick' if quick else 'full'} mode)", file=out,
              flush=True)
        with tempfile.TemporaryDirectory(prefix="diloco_lite_grade_") as tmp:
            record = Path(tmp) / "verdicts.jsonl"
            problems = execute(nb, path.resolve().parent, record, timeout=timeout, quick=quick)
            found = verdicts(record)
    except Unusable as err:
        print(f"grade: {err}", file=sys.stderr)
        return 2
    lines, status = report(name, found, problems)
    for line in lines:
        print(line, file=out)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diloco_lite.exercises",
        description="Grade an exercise notebook, or write the student pack.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="run a student's notebook and grade its exercises")
    g.add_argument("notebook", type=Path, help="the student's .ipynb")
    g.add_argument("--notebook", dest="which", metavar="NN",
                   help="which exercise notebook it is (00..08), if its name does not say")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per cell (600)")
    g.add_argument("--full", action="store_true", help="run in full mode, not quick mode")
    p = sub.add_parser("pack", help="write the student pack: blank notebooks and a README")
    p.add_argument("folder", type=Path, nargs="?", default=Path("build/student-pack"))
    p.add_argument("--root", type=Path, default=Path("."), help="the repository (.)")
    args = parser.parse_args(argv)
    if args.command == "grade":
        return grade(args.notebook, notebook=args.which, timeout=args.timeout,
                     quick=not args.full)
    from .pack import write_pack

    try:
        written = write_pack(args.root, args.folder)
    except (OSError, ValueError) as err:
        print(f"pack: {err}", file=sys.stderr)
        return 2
    for path in written:
        print("wrote", path)
    return 0
