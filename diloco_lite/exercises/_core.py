"""The machinery every `check_*` shares: call the student's code safely, compare it with a
reference and with known mistakes, and print one sentence.

A check is a function decorated with `@exercise(title, todo=...)` that returns `passed(...)` or
`failed(...)` (or raises `Stop` through `attempt`/`answer`). The decorator prints the verdict,
never a traceback: an exception in the student's code becomes a sentence, an unfilled `TODO`
becomes "not done yet" with the exercise's hint. Numbers are compared at the highest matmul
precision, so a check means the same on CPU, GPU (no TF32) and TPU (no bf16 passes).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..plots.tables import number as fmt  # noqa: F401  (thousands separators, 4 digits)

TODO, ERROR, OTHER = "todo", "error", "other"  # mistake keys shared by every check
PASS_MARK, FAIL_MARK = "✔", "✘"
CHECKS: dict[str, tuple[str, str]] = {}  # check name -> (title, todo hint): what tests read
# When this environment variable names a file, every verdict is also appended to it as one JSON
# line ({"check", "title", "ok", "mistake", "message"}): what the grader reads.
RECORD_ENV = "DILOCO_LITE_GRADE_RECORD"


@dataclasses.dataclass(frozen=True)
class Result:
    """A check's verdict. `mistake` names the recognised mistake ("sign", "todo", ...)."""

    title: str
    ok: bool
    message: str
    mistake: str | None = None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{PASS_MARK if self.ok else FAIL_MARK} {self.title}: {self.message}"

    def _ipython_display_(self) -> None:
        """Already printed by the check: show nothing more when it ends a cell."""


class Stop(Exception):
    """Raised inside a check to end it with a failed verdict (`key`, `message`)."""

    def __init__(self, key: str, message: str = ""):
        super().__init__(message)
        self.key, self.message = key, message


def passed(message: str) -> Result:
    return Result("", True, message)


def failed(key: str, message: str) -> Result:
    return Result("", False, message, key)


def exercise(title: str, todo: str) -> Callable:
    """Decorate a check: print its verdict as one line, titled `title`; `todo` is the hint shown
    while the student's answer is still the blank `...`."""

    def wrap(check: Callable[..., Result]) -> Callable[..., Result]:
        CHECKS[check.__name__] = (title, todo)

        @functools.wraps(check)
        def run(*args: Any, **kwargs: Any) -> Result:
            import jax

            with jax.default_matmul_precision("highest"):
                try:
                    result = check(*args, **kwargs)
                except Stop as stop:
                    message = f"not done yet: {todo}" if stop.key == TODO else stop.message
                    result = failed(stop.key, message)
                except Exception as err:  # the check could not even read the answer
                    result = failed(ERROR, f"could not check your answer ({_short(err)}); "
                                           "compare its type and shape with the exercise's")
            result = dataclasses.replace(result, title=title)
            print(result, flush=True)
            record(check.__name__, result)
            return result

        return run

    return wrap


def record(name: str, result: Result) -> None:
    """Append the verdict to the file `$DILOCO_LITE_GRADE_RECORD` names, if it names one."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    line = json.dumps(dict(check=name, title=result.title, ok=result.ok, mistake=result.mistake,
                           message=result.message), ensure_ascii=False)
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError:
        pass  # grading is best effort: the printed line is the verdict


def blank(value: Any) -> bool:
    """Whether `value` is still the exercise's placeholder (`...`) or missing (`None`)."""
    return value is None or value is Ellipsis


def answer(value: Any) -> Any:
    """The student's value, or `Stop(TODO)` while it is still blank."""
    if blank(value):
        raise Stop(TODO)
    return value


def number(value: Any) -> float:
    """The student's number as a float, or `Stop(TODO)` while it is still blank."""
    return float(answer(value))


def attempt(fn: Any, *args: Any, explain: Callable[[Exception], str | None] | None = None):
    """`fn(*args)`; a blank `fn` or result stops with TODO, an exception with a sentence
    (`explain(err)` may turn a known error into a hint: return `"key: sentence"`)."""
    answer(fn)
    if not callable(fn):
        raise Stop(ERROR, f"expected a function, got {type(fn).__name__}")
    try:
        out = fn(*args)
    except Stop:
        raise
    except Exception as err:
        hint = explain(err) if explain else None
        if hint:
            key, _, sentence = hint.partition(": ")
            raise Stop(key, sentence) from None
        raise Stop(ERROR, f"your code raised {_short(err)}") from None
    return answer(out)


def judge(got: Any, expected: Any, *, success: str,
          mistakes: Iterable[tuple[str, Any, str]] = (), other: str,
          rtol: float = 1e-4, atol: float = 1e-7) -> Result:
    """`passed(success)` if `got` is close to `expected`; else the first mistake
    `(key, wrong_value, sentence)` that `got` is close to; else `failed(OTHER, other)`."""
    got = answer(got)
    if close(got, expected, rtol, atol):
        return passed(success)
    for key, wrong, sentence in mistakes:
        if close(got, wrong, rtol, atol):
            return failed(key, sentence)
    return failed(OTHER, other)


def close(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-7) -> bool:
    """Same pytree structure and shapes, and every leaf within rtol·max|b| + atol."""
    import jax

    try:
        la, ta = jax.tree.flatten(a)
        lb, tb = jax.tree.flatten(b)
    except Exception:
        return False
    if ta != tb:
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape or not np.all(np.isfinite(x)):
            return False
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        if y.size and float(np.max(np.abs(x - y))) > rtol * scale + atol:
            return False
    return True


def shapes(tree: Any) -> str:
    """'{b: (4,), w: (4, 3)}'-like summary of a pytree's leaf shapes, for messages."""
    import jax

    try:
        leaves = jax.tree_util.tree_leaves_with_path(tree)
    except Exception:
        return type(tree).__name__
    return ", ".join(f"{jax.tree_util.keystr(p) or 'value'}: {tuple(np.shape(x))}"
                     for p, x in leaves)


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__
