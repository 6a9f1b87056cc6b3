"""The checks every boundary applies to user values, in one place. Each raises
`ValidationError(path, value, problem)` naming the field by its path (`gpu.services.judge.dops`,
`exec.timeout`) so the message says where the bad value sits, and returns the value checked."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from tangram.errors import TangramError, ValidationError
from topology import is_pow2


def is_number(v: Any) -> bool:
    """An int or float that is not a bool (True is an int in Python, never a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(path: str, v: Any) -> float:
    if not is_number(v) or not math.isfinite(v):
        raise ValidationError(path, v, "must be a finite number")
    return float(v)


def pos_num(path: str, v: Any, allow_zero: bool = False, unit: str = "") -> float:
    """A finite number > 0 (>= 0 with `allow_zero`)."""
    if not is_number(v) or not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        what = "non-negative" if allow_zero else "positive"
        raise ValidationError(path, v, f"must be a finite {what} number{unit}")
    return float(v)


def pos_int(path: str, v: Any, unit: str = "") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValidationError(path, v, f"must be a positive integer{unit}")
    return v


def optional_pos_int(path: str, v: Any) -> int | None:
    return None if v is None else pos_int(path, v)


def power_of_two(path: str, v: Any) -> int:
    pos_int(path, v)
    if not is_pow2(v):
        raise ValidationError(path, v, "must be a power of two")
    return v


def boolean(path: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValidationError(path, v, "must be true or false")
    return v


def mapping(path: str, v: Any, allowed: Collection[str] | None = None) -> dict:
    """A mapping (None reads as empty) whose keys are all in `allowed` (any key when None)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValidationError(path, v, "must be a mapping")
    if allowed is not None:
        unknown = sorted(set(v) - set(allowed), key=str)
        if unknown:
            raise ValidationError(
                f"{path}.{unknown[0]}",
                v[unknown[0]],
                f"unknown key (allowed: {sorted(allowed, key=str)})",
            )
    return v


def one_of(path: str, v: Any, allowed: Collection[str]) -> str:
    if v not in allowed:
        raise ValidationError(path, v, f"must be one of {sorted(allowed)}")
    return v


def number(path: str, v: Any, positive: bool = False, allow_zero: bool = True) -> float:
    """A finite number >= 0 (> 0 with `positive` or without `allow_zero`)."""
    finite(path, v)
    if (positive and v <= 0) or (not allow_zero and v == 0) or v < 0:
        raise ValidationError(path, v, "must be positive" if positive else "must be >= 0")
    return float(v)


def integer(path: str, v: Any, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValidationError(path, v, f"must be an integer >= {minimum}")
    return v


def keys(path: str, obj: Any, required: Collection[str], optional: Collection[str]) -> dict:
    """An object with every `required` key and no key outside `required | optional`."""
    if not isinstance(obj, dict):
        raise ValidationError(path, obj, "must be an object")
    missing = sorted(set(required) - set(obj))
    if missing:
        raise ValidationError(f"{path}.{missing[0]}", None, "is required")
    return mapping(path, obj, {*required, *optional})


def read_document(
    path: str | Path,
    what: str,
    parse: Callable[[str], Any],
    syntax_error: type[Exception] | tuple[type[Exception], ...],
    syntax: str,
) -> Any:
    """The parsed content of a file a user named (`what` says which kind, for the message):
    a missing file or a syntax error is a `TangramError` naming the file, not a traceback."""
    try:
        return parse(Path(path).read_text())
    except FileNotFoundError:
        raise TangramError(f"{what} {path}: not found") from None
    except syntax_error as exc:
        raise TangramError(f"{what} {path}: not valid {syntax} ({exc})") from None
