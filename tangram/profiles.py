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

import dataclasses
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tangram.actions import Action, Elasticity
from tangram.errors import ValidationError
from tangram.results import Status

MAX_SERIAL = 4.0  # a serial fraction above 1 means more units make the run slower
PRIOR_T_ORI = 10.0  # s: first guess for an elastic kind's single-unit time, refined online
PRIOR_SERIAL = 0.25  # Amdahl prior for elastic test runs: pytest-xdist ~2.3x at n=4, ~2.9x
# at n=8 (docs/calibration.md §4 reports 1.6-3.3x on 4-14 workers)
DEFAULT_S = 1.0  # s: the estimate of a non-elastic kind before its first completion
FIT_WINDOW = 256  # observations an AmdahlFit keeps (the latest)
MAX_KINDS = 4096  # kinds with a profile (least recently used dropped)
MAX_KIND = 128  # characters of a trusted kind

LEARNED = frozenset({Status.OK, Status.ERROR})  # ran to its end: its time is an observation
CENSORED = frozenset({Status.TIMEOUT})  # killed at its deadline: it would have run longer


def exec_kind(
    trajectory: str, command: str | list[str] | tuple[str, ...], kind: str | None = None
) -> str:
    """The profile key of an exec: `kind:<kind>` when the trusted caller names it (an adapter
    from its tool's name, /run_code from its language), shared by every trajectory; else
    `exec:["<trajectory>", "<first word>"]`, the model-written command's own word, seen by its
    trajectory alone."""
    if kind is not None:
        if (
            not isinstance(kind, str)
            or not 1 <= len(kind) <= MAX_KIND
            or any(ord(c) < 32 or ord(c) == 127 for c in kind)
        ):
            raise ValidationError(
                "exec.kind", kind, f"must be 1 to {MAX_KIND} characters without control characters"
            )
        return f"kind:{kind}"
    first = (
        (command.split() or ["?"])[0]
        if isinstance(command, str)
        else (command[0] if command else "?")
    )
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

    _sums: list[float] = field(default_factory=lambda: [0.0] * 6)
    """Running sums over `obs` (x = 1/m, y = duration): x, y, x^2, xy, the prior's scale
    (duration * E_prior(m) * m), and a spare; so a fit costs O(1) however long the history."""
    _cache: tuple[float, float] | None = None

    def add(self, m: int, duration: float) -> None:
        if m >= 1 and duration > 0:
            if self.obs.maxlen is not None and len(self.obs) == self.obs.maxlen:
                self._count(*self.obs[0], -1.0)  # the oldest leaves the window
            self.obs.append((m, duration))
            self._count(m, duration, 1.0)
            self._cache = None

    def reset(self) -> None:
        """Forget every observation (the prior alone decides again)."""
        self.obs.clear()
        self._sums[:] = [0.0] * 6
        self._cache = None

    def _count(self, m: int, duration: float, sign: float) -> None:
        x = 1.0 / m
        s = self._sums
        s[0] += sign * x
        s[1] += sign * duration
        s[2] += sign * x * x
        s[3] += sign * x * duration
        s[4] += sign * duration * amdahl_efficiency(m, self.prior_serial) * m

    def params(self) -> tuple[float, float]:
        """(T_ori, serial fraction) of the fit."""
        if self._cache is None:
            self._cache = self._params()
        return self._cache

    def _params(self) -> tuple[float, float]:
        s0, t0 = self.prior_serial, self.prior_t_ori
        n = len(self.obs)
        w0 = self.prior_weight / max(1, n)  # fades as observations accumulate
        sx, sy, sxx, sxy, scale, _ = self._sums
        if n:  # the prior's scale follows the data: T_ori from the observed mean
            t0 = scale / n
        for m in (1, 2):  # the prior's two pseudo-observations, weight w0 each
            x, y = 1.0 / m, t0 * (s0 + (1 - s0) / m)
            sx, sy, sxx, sxy = sx + w0 * x, sy + w0 * y, sxx + w0 * x * x, sxy + w0 * x * y
        sw = n + 2 * w0
        mx, my = sx / sw, sy / sw
        vxx = sxx - sw * mx * mx
        vxy = sxy - sw * mx * my
        b = vxy / vxx if vxx > 1e-12 * sw else t0 * (1 - s0)
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
        return amdahl(s)

    def predict(self, m: int) -> float:
        t, s = self.params()
        return t / (amdahl_efficiency(m, s) * m)


def amdahl_efficiency(m: int, serial: float, t_ori: float = 1.0, spawn_s: float = 0.0) -> float:
    """Amdahl's law, the one home of the formula: E(m) of a run with serial fraction `serial`
    (and `spawn_s` seconds per extra worker, out of `t_ori`), so that
    `t_ori / (E(m) m) = t_ori (serial + (1 - serial) / m) + spawn_s (m - 1)`.
    In (0, 1] for every serial >= 0 (min: rounding at m = 1)."""
    if m == 1:
        return 1.0
    duration = t_ori * (serial + (1.0 - serial) / m) + spawn_s * (m - 1)
    return min(1.0, t_ori / (m * duration))


def amdahl(serial: float, t_ori: float = 1.0, spawn_s: float = 0.0) -> Callable[[int], float]:
    """`amdahl_efficiency` as an efficiency function E(m), what an `Elasticity` takes."""
    return lambda m: amdahl_efficiency(m, serial, t_ori, spawn_s)


@dataclass(slots=True)
class _Stat:
    n: int = 0
    mean: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        self.mean += (x - self.mean) / self.n


class DurationProfiles:
    def __init__(self, default: float = DEFAULT_S) -> None:
        self.default = default
        self._run: dict[str, _Stat] = {}
        self._t_ori: dict[str, _Stat] = {}
        self._fits: dict[str, AmdahlFit] = {}

    def record(
        self,
        action: Action,
        units: Mapping[str, int] | None,
        run_s: float,
        status: Status = Status.OK,
    ) -> None:
        """The learning rule, one for the runtime and the simulator: a run that ended
        (`LEARNED`) is an observation of its time; a run killed at its timeout (`CENSORED`)
        counts at its timeout, a lower bound of its true time (the estimates it pulls toward
        are clipped to the timeout anyway, `Action.timeout`); a run that never ran to an end
        (failed, cancelled) teaches nothing."""
        if status in LEARNED or status in CENSORED:
            self.observe(action, units, run_s)

    def observe(self, action: Action, units: Mapping[str, int] | None, run_s: float) -> None:
        if run_s < 0:
            return
        el = action.elasticity
        fit = self._fits.get(action.kind)
        if fit is None and el is not None:  # the kind's curve, from its first elastic run on
            fit = self.speedup(action.kind, PRIOR_SERIAL, PRIOR_T_ORI, el.key)
        if fit is not None and units and fit.key in units:  # fixed runs of the kind count too
            fit.add(units[fit.key], run_s)
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

    def speedup(
        self, kind: str, prior_serial: float, prior_t_ori: float, key: str = "cpu"
    ) -> AmdahlFit:
        """The kind's fitted speedup curve over `key` units (created with this prior on first
        use; every later completion of the kind, elastic or not, refines it)."""
        return _recent(self._fits, kind, lambda: AmdahlFit(prior_serial, prior_t_ori, key))

    def count(self, kind: str) -> int:
        return sum(s.n for d in (self._run, self._t_ori) if (s := d.get(kind)))

    def estimate(self, action: Action, units: int | None = None) -> float:
        """The action's own model when it has one, else its kind's history, else the default;
        never past the action's timeout (it is killed there)."""
        d = action.duration_at(units)  # already clipped to the timeout
        if d is not None:
            return d
        m = self.mean(action.kind)
        d = m if m is not None else self.default
        return d if action.timeout is None else min(d, action.timeout)

    def learned_elasticity(self, kind: str, key: str) -> Elasticity:
        """What the scheduler knows of an elastic kind: the fitted T_ori and E(m) of its
        `AmdahlFit` (the prior `PRIOR_T_ORI`, `PRIOR_SERIAL` before any run)."""
        fit = self.speedup(kind, PRIOR_SERIAL, PRIOR_T_ORI, key)
        t_ori, serial = fit.params()
        return Elasticity(key, t_ori, amdahl(serial))

    def as_seen(self, action: Action, now: float) -> Action:
        """`action` as a scheduler sees it when it is submitted at `now`: its timeout and its
        demands, but for durations only what this history knows (`learned_elasticity` for an
        elastic action, its kind's mean for another); never the true duration. The runtime
        builds its actions so (`Tangram.exec`), the simulator turns its sampled ones so."""
        el = action.elasticity
        if el is not None and not action.demands[el.key].is_fixed:
            return dataclasses.replace(
                action,
                submit_time=now,
                duration=None,
                elasticity=self.learned_elasticity(action.kind, el.key),
            )
        return dataclasses.replace(action, submit_time=now, duration=None, elasticity=None)


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
