"""The checks every config and function argument goes through: a bad value raises a `ValueError`
that names the field, the value and the allowed range (`check`), before it can reach JAX.

A module of its own (no imports from the package), so that `config` and `clock`, which validate
each other's fields, both use it without importing each other in a cycle.
"""

from __future__ import annotations

from typing import Any


def check(ok: bool, field: str, value: Any, allowed: str) -> None:
    """Raise a `ValueError` naming `field`, its `value` and the `allowed` range unless `ok`."""
    if not ok:
        raise ValueError(f"{field}={value!r} is invalid: must be {allowed}")


def check_int(field: str, value: Any, low: int, high: int | None = None) -> None:
    """`value` must be an int (not bool) in [low, high] (high=None: unbounded)."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = is_int and value >= low and (high is None or value <= high)
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    check(ok, field, value, allowed)


def check_positive(field: str, value: Any) -> None:
    """`value` must be a finite real number > 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and value == value and value > 0 and value != float("inf")
    check(ok, field, value, "a finite number > 0")


def check_nonnegative(field: str, value: Any) -> None:
    """`value` must be a finite real number >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and value == value and 0 <= value != float("inf")
    check(ok, field, value, "a finite number >= 0")
