"""DPArrange (paper Algorithm 3, Appendix B): the optimal discrete split of free units.

Each task is a mapping {allowed amount: duration}. One forward pass over the tasks fills a DP
layer per prefix; `DPTable.best(t)` reads the optimum for the first t tasks from that same pass,
which is what greedy eviction needs (it evicts from the back). The optimum is taken over every
end state, not only "all units used": when E(m)*m stops growing, fewer units can be faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tangram.errors import Infeasible, ValidationError
from topology import ChunkOperator, FlatOperator

Operator = FlatOperator | ChunkOperator


@dataclass(frozen=True, slots=True)
class Arrangement:
    total: float
    units: tuple[int, ...]


TaskArrays = tuple[np.ndarray, np.ndarray]


def _task_arrays(i: int, task: Mapping[int, float] | TaskArrays) -> TaskArrays:
    if isinstance(task, tuple):  # already (amounts, durations) arrays, validated by the caller
        return task
    if not task:
        raise ValidationError(f"tasks[{i}]", task, "needs at least one allowed amount")
    amounts = np.fromiter(task.keys(), dtype=np.int64, count=len(task))
    durs = np.fromiter(task.values(), dtype=np.float64, count=len(task))
    if amounts.min() <= 0:
        raise ValidationError(f"tasks[{i}]", dict(task), "amounts must be positive")
    if not (durs.min() >= 0 and math.isfinite(durs.sum())):  # NaN fails both
        raise ValidationError(f"tasks[{i}]", dict(task), "durations must be finite and >= 0")
    return amounts, durs


class DPTable:
    """The DP over all prefixes of `tasks`, filled in one pass."""

    __slots__ = ("op", "n", "_costs", "_choice", "_pred", "_amounts")

    def __init__(self, tasks: Sequence[Mapping[int, float] | TaskArrays], op: Operator) -> None:
        self.op = op
        self.n = len(tasks)
        layer = np.full(op.num_states, math.inf)
        layer[op.initial] = 0.0
        self._costs = [layer]
        self._choice: list[np.ndarray] = []
        self._pred: list[np.ndarray] = []
        self._amounts: list[np.ndarray] = []
        for i, task in enumerate(tasks):
            amounts, durs = _task_arrays(i, task)
            layer, choice, pred = op.step(layer, amounts, durs)
            self._costs.append(layer)
            self._choice.append(choice)
            self._pred.append(pred)
            self._amounts.append(amounts)

    def best_total(self, t: int) -> float:
        """Least total duration of the first t tasks (inf when infeasible)."""
        return float(self._costs[t].min())

    def best(self, t: int | None = None) -> Arrangement:
        """The optimal arrangement of the first t tasks (all by default)."""
        t = self.n if t is None else t
        layer = self._costs[t]
        state = int(layer.argmin())
        total = float(layer[state])
        if not math.isfinite(total):
            raise Infeasible(f"no feasible arrangement of {t} tasks on {self.op!r}")
        units = [0] * t
        for i in range(t - 1, -1, -1):
            units[i] = int(self._amounts[i][self._choice[i][state]])
            state = int(self._pred[i][state])
        return Arrangement(total, tuple(units))


class OneTask:
    """`DPTable` of a single task on interchangeable units (a `FlatOperator`), without numpy:
    the optimum is the task's fastest allowed amount, the smallest one among equally fast (the
    lowest DP state, which is what `DPTable.best` picks). Most groups of a decision hold one
    elastic candidate, and this answers them in a few microseconds."""

    __slots__ = ("n", "_best")

    def __init__(self, task: TaskArrays) -> None:
        self.n = 1
        amounts, durs = task
        self._best = min(zip(durs.tolist(), amounts.tolist()))  # (duration, amount)

    def best(self, t: int | None = None) -> Arrangement:
        if t == 0:
            return Arrangement(0.0, ())
        d, m = self._best
        return Arrangement(float(d), (int(m),))


def dp_table(tasks: Sequence[TaskArrays], op: Operator) -> DPTable | OneTask:
    """The DP over all prefixes of `tasks` (already validated arrays, amounts within the
    operator's units)."""
    if len(tasks) == 1 and isinstance(op, FlatOperator):
        return OneTask(tasks[0])
    return DPTable(tasks, op)


def dp_arrange(tasks: Sequence[Mapping[int, float]], op: Operator) -> Arrangement:
    """Least sum of durations over one allowed amount per task within the operator's capacity.

    Raises `tangram.Infeasible` when no choice fits.
    """
    return DPTable(tasks, op).best()
