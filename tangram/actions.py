"""Actions and their elasticity (paper 4.1).

An action is one atomic call on external resources: a tool call or a reward computation. Its cost
is a vector of demands, one per resource type. At most one resource is its *key elastic
resource*; with m units of it the action takes `T_ori / (E(m) * m)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from tangram.errors import ValidationError
from tangram.resources import Demand
from tangram.validation import pos_num

Efficiency = Mapping[int, float] | Callable[[int], float]


@dataclass(frozen=True, slots=True)
class Elasticity:
    """Key resource, single-unit duration `t_ori` and parallel efficiency E(m) in (0, 1]."""

    key: str
    t_ori: float
    efficiency: Efficiency

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValidationError("elasticity.key", self.key, "must be a resource name")
        object.__setattr__(self, "t_ori", pos_num("elasticity.t_ori", self.t_ori))
        if isinstance(self.efficiency, Mapping):
            table = {}
            for m, e in self.efficiency.items():
                try:
                    mi = int(m)
                except (TypeError, ValueError):
                    raise ValidationError(
                        "elasticity.efficiency", m, "keys must be integers"
                    ) from None
                table[mi] = self._check_e(mi, e)
            object.__setattr__(self, "efficiency", MappingProxyType(table))
        elif not callable(self.efficiency):
            raise ValidationError(
                "elasticity.efficiency",
                self.efficiency,
                "must be a table {units: E} or a function of units",
            )

    @staticmethod
    def _check_e(m: int, e: Any) -> float:
        if isinstance(e, bool) or not isinstance(e, (int, float)):
            raise ValidationError(f"elasticity.efficiency[{m}]", e, "must be a number")
        e = float(e)
        if not (0.0 < e <= 1.0):  # also rejects NaN
            raise ValidationError(f"elasticity.efficiency[{m}]", e, "must be in (0, 1]")
        return e

    def e(self, m: int) -> float:
        if isinstance(self.efficiency, Mapping):
            try:
                return self.efficiency[m]
            except KeyError:
                raise ValidationError(
                    "elasticity.efficiency", m, "no entry for this amount"
                ) from None
        return self._check_e(m, self.efficiency(m))

    def duration(self, m: int) -> float:
        """`T_ori / (E(m) * m)`."""
        return self.t_ori / (self.e(m) * m)


@dataclass(frozen=True, slots=True, eq=False)
class Action:
    """One tool call or reward computation.

    `duration` is the modelled run time of a non-elastic action (None when unknown: the
    scheduler then uses the learned profile of its `kind`). `payload` is what the manager runs.
    `timeout`: the action is killed after this many seconds of running (None: never), so no
    estimate of its duration exceeds it (`options`, `duration_at`), while `duration` and
    `elasticity` keep the modelled truth the simulator plays.
    """

    id: str
    demands: Mapping[str, Demand]
    elasticity: Elasticity | None = None
    duration: float | None = None
    trajectory: str | None = None
    task: str | None = None
    kind: str = "default"
    service: str | None = None
    payload: Any = None
    submit_time: float = 0.0
    timeout: float | None = None
    mins: Mapping[str, int] = field(init=False, repr=False)
    options: tuple[tuple[int, float], ...] = field(init=False, repr=False)
    """(units of the key resource, modelled duration) per allowed amount; () if not elastic."""
    option_arrays: tuple[Any, Any] | None = field(init=False, repr=False)
    """`options` as (amounts, durations) numpy arrays, for the DP."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValidationError("action.id", self.id, "must be a non-empty string")
        if not isinstance(self.demands, Mapping) or not self.demands:
            raise ValidationError(
                f"action[{self.id}].demands", self.demands, "must name at least one resource"
            )
        demands = {}
        for r, d in self.demands.items():
            if not isinstance(r, str) or not r:
                raise ValidationError(f"action[{self.id}].demands", r, "resource names are strings")
            demands[r] = Demand.parse(d, f"action[{self.id}].demands.{r}")
        object.__setattr__(self, "demands", MappingProxyType(demands))
        object.__setattr__(self, "mins", MappingProxyType({r: d.min for r, d in demands.items()}))
        if self.duration is not None:
            object.__setattr__(
                self, "duration", pos_num(f"action[{self.id}].duration", self.duration)
            )
        if not isinstance(self.submit_time, (int, float)) or not math.isfinite(self.submit_time):
            raise ValidationError(
                f"action[{self.id}].submit_time", self.submit_time, "must be a finite number"
            )
        if self.timeout is not None:
            object.__setattr__(self, "timeout", pos_num(f"action[{self.id}].timeout", self.timeout))
        el = self.elasticity
        object.__setattr__(self, "options", ())
        object.__setattr__(self, "option_arrays", None)
        if el is not None:
            if el.key not in demands:
                raise ValidationError(
                    f"action[{self.id}].elasticity.key",
                    el.key,
                    f"is not among the demanded resources {sorted(demands)}",
                )
            for m in demands[el.key].amounts:
                try:
                    el.e(m)
                except ValidationError as exc:
                    raise ValidationError(
                        f"action[{self.id}].elasticity.efficiency",
                        m,
                        f"missing or bad efficiency for allowed amount ({exc.problem})",
                    ) from None
            cap = math.inf if self.timeout is None else self.timeout
            object.__setattr__(
                self,
                "options",
                tuple((m, min(cap, el.duration(m))) for m in demands[el.key].amounts),
            )
            object.__setattr__(
                self,
                "option_arrays",
                (
                    np.array([m for m, _ in self.options], dtype=np.int64),
                    np.array([d for _, d in self.options], dtype=np.float64),
                ),
            )

    @property
    def key(self) -> str | None:
        return self.elasticity.key if self.elasticity is not None else None

    @property
    def is_elastic(self) -> bool:
        el = self.elasticity
        return el is not None and not self.demands[el.key].is_fixed

    def duration_at(self, units: int | None = None) -> float | None:
        """Modelled duration with `units` of the key resource (elastic) or the fixed duration."""
        if self.options:
            if units is None:
                return self.options[0][1]
            for m, d in self.options:
                if m == units:
                    return d
        el = self.elasticity
        if el is not None:
            d = el.duration(units if units is not None else self.demands[el.key].min)
        else:
            d = self.duration
        if d is None or self.timeout is None:
            return d
        return min(d, self.timeout)
