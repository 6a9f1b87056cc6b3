"""`dp_table`'s two answers keep one interface (mutation testing, docs/mutation.md): `n` is
the number of tasks on the one-task shortcut as on the numpy DP, and `best()` with no argument
arranges all of them."""

from __future__ import annotations

import numpy as np

from solvers.heuristic.dparrange import DPTable, OneTask, dp_table
from topology import FlatOperator


def task(*pairs: tuple[int, float]):
    return np.array([m for m, _ in pairs]), np.array([d for _, d in pairs])


def test_the_shortcut_and_the_dp_say_how_many_tasks_they_arrange():
    one = dp_table([task((1, 4.0), (2, 2.5))], FlatOperator(4))
    two = dp_table([task((1, 4.0), (2, 2.5)), task((1, 3.0))], FlatOperator(4))
    assert isinstance(one, OneTask) and isinstance(two, DPTable)
    assert one.n == 1 and two.n == 2
    for table in (one, two):
        assert len(table.best().units) == table.n
        assert table.best(0).units == ()
