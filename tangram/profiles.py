"""Duration profiles learned online per action kind (paper 4.1 "Durations").

Non-scalable actions: the historical mean run time of their kind. Elastic actions: a fitted
`T_ori` (each observation gives `T_ori = run * E(m) * m`), so the scheduler improves with use and
needs no hand-entered numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram.actions import Action


@dataclass(slots=True)
class _Stat:
    n: int = 0
    mean: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.mean += (x - self.mean) / self.n


class DurationProfiles:
    def __init__(self, default: float = 1.0) -> None:
        self.default = default
        self._run: dict[str, _Stat] = {}
        self._t_ori: dict[str, _Stat] = {}

    def observe(self, action: Action, units: dict[str, int] | None, run_s: float) -> None:
        if run_s < 0:
            return
        el = action.elasticity
        if el is not None and units and el.key in units:
            m = units[el.key]
            self._t_ori.setdefault(action.kind, _Stat()).add(run_s * el.e(m) * m)
        else:
            self._run.setdefault(action.kind, _Stat()).add(run_s)

    def mean(self, kind: str) -> float | None:
        s = self._run.get(kind)
        return s.mean if s else None

    def t_ori(self, kind: str) -> float | None:
        s = self._t_ori.get(kind)
        return s.mean if s else None

    def count(self, kind: str) -> int:
        return sum(s.n for d in (self._run, self._t_ori) if (s := d.get(kind)))

    def estimate(self, action: Action, units: int | None = None) -> float:
        """The action's own model when it has one, else its kind's history, else the default."""
        d = action.duration_at(units)
        if d is not None:
            return d
        m = self.mean(action.kind)
        return m if m is not None else self.default
