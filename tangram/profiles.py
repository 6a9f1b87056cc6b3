"""Duration profiles learned online per action kind (paper 4.1 "Durations").

Non-scalable actions: the historical mean run time of their kind. Elastic actions: a fitted
`T_ori` (each observation gives `T_ori = run * E(m) * m`), and, per kind, the speedup curve
itself: `AmdahlFit`, a least-squares fit of `duration(m) = a + b / m` to the observed
(units, run time) pairs, so elastic grants follow what the workload does rather than a prior.

Bounded, and hard to steer: a fit keeps its last `FIT_WINDOW` observations, a mean is a running
mean (two numbers, and independent of the order of completions, so a scoped and a global
scheduler that see the same completions estimate alike), at most `MAX_KINDS` kinds are kept (the
least recently used go first). An action's kind is its trusted caller's name for it (`exec_kind`);
without one, it is scoped to the trajectory, so a command that lies about what it is (`echo
x; sleep 3`) moves only its own trajectory's estimates.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tangram.actions import Action
from tangram.errors import ValidationError

MAX_SERIAL = 4.0  # a serial fraction above 1 means more units make the run slower
FIT_WINDOW = 256  # observations an AmdahlFit keeps (the latest)
MAX_KINDS = 4096  # kinds with a profile (least recently used dropped)
MAX_KIND = 128  # characters of a trusted kind


def exec_kind(trajectory: str, command: str | list[str] | tuple[str, ...],
              kind: str | None = None) -> str:
    """The profile key of an exec: `kind:<kind>` when the trusted caller names it (an adapter
    from its tool's name, /run_code from its language), shared by every trajectory; else
    `exec:["<trajectory>", "<first word>"]`, the model-written command's own word, seen by its
    trajectory alone."""
    if kind is not None:
        if not isinstance(kind, str) or not 1 <= len(kind) <= MAX_KIND \
                or any(ord(c) < 32 or ord(c) == 127 for c in kind):
            raise ValidationError("exec.kind", kind, f"must be 1 to {MAX_KIND} characters "
                                  f"without control characters")
        return f"kind:{kind}"
    first = (command.split() or ["?"])[0] if isinstance(command, str) else \
        (command[0] if command else "?")
    return "exec:" + json.dumps([trajectory, first.rsplit("/", 1)[-1][:MAX_KIND]])


@dataclass(slots=True)
class AmdahlFit:
    """`duration(m) = a + b / m`, i.e. `T_ori = a + b` and serial fraction `s = a / (a + b)`,
    fitted by least squares to (m, duration) observations plus prior pseudo-observations at
    m = 1 and m = 2 whose weight `prior_weight / n` fades with the n observations: with one
    amount observed the prior gives the shape, with two or more the data decide.

    E(m) = 1 / (m s + 1 - s) lies in (0, 1] for every s >= 0; s > 1 (clipped at MAX_SERIAL)
    models runs that get slower with more units (worker start-up beating the gain).
    """

    prior_serial: float
    prior_t_ori: float
    key: str = "cpu"
    prior_weight: float = 1.0
    obs: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=FIT_WINDOW))

    def add(self, m: int, duration: float) -> None:
        if m >= 1 and duration > 0:
            self.obs.append((m, duration))

    def params(self) -> tuple[float, float]:
        """(T_ori, serial fraction) of the fit."""
        s0, t0 = self.prior_serial, self.prior_t_ori
        w0 = self.prior_weight / max(1, len(self.obs))  # fades as observations accumulate
        if self.obs:  # the prior's scale follows the data: T_ori from the observed mean
            t0 = sum(d * _efficiency(s0, m) * m for m, d in self.obs) / len(self.obs)
        pts = [(1.0 / m, d, 1.0) for m, d in self.obs]
        pts += [(1.0 / m, t0 * (s0 + (1 - s0) / m), w0) for m in (1, 2)]
        sw = sum(w for _, _, w in pts)
        mx = sum(w * x for x, _, w in pts) / sw
        my = sum(w * y for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        sxy = sum(w * (x - mx) * (y - my) for x, y, w in pts)
        b = sxy / sxx if sxx > 0 else t0 * (1 - s0)
        a = my - b * mx
        t_ori = a + b
        if t_ori <= 0:
            return t0, s0
        return t_ori, min(MAX_SERIAL, max(0.0, a / t_ori))

    @property
    def t_ori(self) -> float:
        return self.params()[0]

    @property
    def serial(self) -> float:
        return self.params()[1]

    def efficiency(self) -> Callable[[int], float]:
        s = self.serial
        return lambda m: _efficiency(s, m)

    def predict(self, m: int) -> float:
        t, s = self.params()
        return t / (_efficiency(s, m) * m)


def _efficiency(serial: float, m: int) -> float:
    return min(1.0, 1.0 / (m * serial + 1.0 - serial))  # min: rounding at m = 1



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
        self._fits: dict[str, AmdahlFit] = {}

    def observe(self, action: Action, units: dict[str, int] | None, run_s: float) -> None:
        if run_s < 0:
            return
        fit = self._fits.get(action.kind)
        if fit is not None and units and fit.key in units:  # fixed runs of the kind count too
            fit.add(units[fit.key], run_s)
        el = action.elasticity
        if el is not None and units and el.key in units:
            m = units[el.key]
            _recent(self._t_ori, action.kind, _Stat).add(run_s * el.e(m) * m)
        else:
            _recent(self._run, action.kind, _Stat).add(run_s)

    def mean(self, kind: str) -> float | None:
        s = self._run.get(kind)
        return s.mean if s else None

    def t_ori(self, kind: str) -> float | None:
        s = self._t_ori.get(kind)
        return s.mean if s else None

    def speedup(self, kind: str, prior_serial: float, prior_t_ori: float,
                key: str = "cpu") -> AmdahlFit:
        """The kind's fitted speedup curve over `key` units (created with this prior on first
        use; every later completion of the kind, elastic or not, refines it)."""
        return _recent(self._fits, kind, lambda: AmdahlFit(prior_serial, prior_t_ori, key))

    def count(self, kind: str) -> int:
        return sum(s.n for d in (self._run, self._t_ori) if (s := d.get(kind)))

    def estimate(self, action: Action, units: int | None = None) -> float:
        """The action's own model when it has one, else its kind's history, else the default."""
        d = action.duration_at(units)
        if d is not None:
            return d
        m = self.mean(action.kind)
        return m if m is not None else self.default


def _recent(table: dict, kind: str, make: Callable[[], object]):
    """`table[kind]` (made when missing), marked most recently used; the table keeps at most
    MAX_KINDS kinds, dropping the least recently used."""
    value = table.pop(kind, None)
    if value is None:
        value = make()
        while len(table) >= MAX_KINDS:
            del table[next(iter(table))]
    table[kind] = value
    return value
