"""Resource demands: the feasible amounts of one resource for one action (paper 4.1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tangram.errors import ValidationError

MAX_AMOUNT = 1 << 20


@dataclass(frozen=True, slots=True)
class Demand:
    """Sorted, distinct, positive allowed amounts. Build with `fixed`, `range` or `choices`."""

    amounts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.amounts:
            raise ValidationError("demand", self.amounts, "must allow at least one amount")
        prev = 0
        for a in self.amounts:
            if isinstance(a, bool) or not isinstance(a, int):
                raise ValidationError("demand", a, "amounts must be integers")
            if a <= 0 or a > MAX_AMOUNT:
                raise ValidationError("demand", a, f"amounts must be in 1..{MAX_AMOUNT}")
            if a <= prev:
                raise ValidationError("demand", self.amounts, "amounts must be sorted, distinct")
            prev = a

    @classmethod
    def fixed(cls, n: int) -> Demand:
        return cls((_as_int("demand", n),))

    @classmethod
    def range(cls, lo: int, hi: int) -> Demand:
        lo, hi = _as_int("demand.min", lo), _as_int("demand.max", hi)
        if lo > hi:
            raise ValidationError("demand", (lo, hi), "min must not exceed max")
        if hi - lo > MAX_AMOUNT:
            raise ValidationError("demand", (lo, hi), "range too wide")
        return cls(tuple(range(lo, hi + 1)))

    @classmethod
    def choices(cls, values: Any) -> Demand:
        vals = [_as_int("demand", v) for v in values]
        if len(set(vals)) != len(vals):
            raise ValidationError("demand", vals, "amounts must be distinct")
        return cls(tuple(sorted(vals)))

    @classmethod
    def parse(cls, value: Any, field: str = "demand") -> Demand:
        """From an int (fixed), a list (discrete set), a (lo, hi) tuple or {"min", "max"}."""
        try:
            if isinstance(value, Demand):
                return value
            if isinstance(value, dict):
                unknown = set(value) - {"min", "max"}
                if unknown or not {"min", "max"} <= set(value):
                    raise ValidationError(field, value, 'a range needs exactly "min" and "max"')
                return cls.range(value["min"], value["max"])
            if isinstance(value, tuple) and len(value) == 2:
                return cls.range(*value)
            if isinstance(value, (list, tuple, set, frozenset)):
                return cls.choices(value)
            return cls.fixed(value)
        except ValidationError as exc:
            if exc.field.startswith(field):
                raise
            raise ValidationError(field, value, exc.problem) from None

    @property
    def min(self) -> int:
        return self.amounts[0]

    @property
    def max(self) -> int:
        return self.amounts[-1]

    @property
    def is_fixed(self) -> bool:
        return len(self.amounts) == 1

    def allows(self, n: int) -> bool:
        lo, hi = 0, len(self.amounts)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.amounts[mid] < n:
                lo = mid + 1
            else:
                hi = mid
        return lo < len(self.amounts) and self.amounts[lo] == n


def _as_int(field: str, v: Any) -> int:
    if isinstance(v, bool):
        raise ValidationError(field, v, "must be an integer")
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            raise ValidationError(field, v, "must be a whole number")
        v = int(v)
    if not isinstance(v, int):
        raise ValidationError(field, v, "must be an integer")
    if v <= 0:
        raise ValidationError(field, v, "must be positive")
    if v > MAX_AMOUNT:
        raise ValidationError(field, v, f"must be at most {MAX_AMOUNT}")
    return v
