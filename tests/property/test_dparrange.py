"""dp_arrange against exhaustive search, for both operators, infeasible cases included."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.heuristic import DPTable, dp_arrange
from solvers.heuristic.dparrange import OneTask, dp_table
from tangram import Infeasible
from topology import ChunkOperator, FlatOperator

durations = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


def flat_tasks(max_amount):
    amounts = st.lists(st.integers(1, max_amount), min_size=1, max_size=4, unique=True)
    return st.lists(
        amounts.flatmap(lambda a: st.fixed_dictionaries({m: durations for m in a})),
        min_size=0,
        max_size=5,
    )


def brute_flat(tasks, units):
    best = math.inf
    for choice in itertools.product(*[list(t) for t in tasks]):
        if sum(choice) <= units:
            best = min(best, sum(t[m] for t, m in zip(tasks, choice)))
    return best


def buddy_take(free, k):
    """Independent model of smallest-fit buddy splitting on pooled free-chunk counts."""
    free = dict(free)
    for s in sorted(free):
        if s >= k and free[s] > 0:
            free[s] -= 1
            half = s // 2
            while half >= k:
                free[half] = free.get(half, 0) + 1
                half //= 2
            return free
    return None


def brute_chunk(tasks, free):
    best = math.inf
    for choice in itertools.product(*[list(t) for t in tasks]):
        state = dict(free)
        for m in choice:
            state = buddy_take(state, m)
            if state is None:
                break
        if state is not None:
            best = min(best, sum(t[m] for t, m in zip(tasks, choice)))
    return best


@settings(max_examples=300, deadline=None)
@given(flat_tasks(6), st.integers(0, 12))
def test_flat_matches_brute_force(tasks, units):
    expect = brute_flat(tasks, units)
    if math.isinf(expect):
        with pytest.raises(Infeasible):
            dp_arrange(tasks, FlatOperator(units))
        return
    res = dp_arrange(tasks, FlatOperator(units))
    assert res.total == pytest.approx(expect)
    assert sum(res.units) <= units
    assert res.total == pytest.approx(sum(t[m] for t, m in zip(tasks, res.units)))


pow2 = st.sampled_from([1, 2, 4, 8])
chunk_tasks = st.lists(
    st.lists(pow2, min_size=1, max_size=4, unique=True).flatmap(
        lambda a: st.fixed_dictionaries({m: durations for m in a})
    ),
    min_size=0,
    max_size=4,
)
free_chunks = st.fixed_dictionaries(
    {1: st.integers(0, 2), 2: st.integers(0, 2), 4: st.integers(0, 1), 8: st.integers(0, 2)}
)


@settings(max_examples=300, deadline=None)
@given(chunk_tasks, free_chunks)
def test_chunk_matches_brute_force(tasks, free):
    expect = brute_chunk(tasks, free)
    if math.isinf(expect):
        with pytest.raises(Infeasible):
            dp_arrange(tasks, ChunkOperator(free))
        return
    res = dp_arrange(tasks, ChunkOperator(free))
    assert res.total == pytest.approx(expect)
    state = dict(free)
    for m in res.units:  # the chosen amounts really fit, in order
        state = buddy_take(state, m)
        assert state is not None


@settings(max_examples=100, deadline=None)
@given(flat_tasks(4), st.integers(0, 10))
def test_every_prefix_from_one_pass(tasks, units):
    table = DPTable(tasks, FlatOperator(units))
    for t in range(len(tasks) + 1):
        assert table.best_total(t) == pytest.approx(brute_flat(tasks[:t], units))


def test_examples_from_the_issue():
    tasks = [{1: 10.0, 2: 5.5, 4: 3.1}, {2: 8.0, 4: 4.2}]
    assert dp_arrange(tasks, FlatOperator(units=12)).units == (4, 4)
    r = dp_arrange(tasks, ChunkOperator(free={1: 1, 2: 0, 4: 1, 8: 2}))
    assert r.total == pytest.approx(7.3)
    # taking 2 from a free 8 leaves a free 4 and a free 2: then a 4 and a 2 still fit
    r = dp_arrange([{2: 1.0}, {4: 1.0}, {2: 1.0}], ChunkOperator(free={8: 1}))
    assert r.units == (2, 4, 2)
    with pytest.raises(Infeasible):
        dp_arrange([{4: 1.0}, {4: 1.0}, {1: 1.0}], ChunkOperator(free={8: 1}))


def test_best_end_state_not_full_use():
    # using more units is slower for this task: the answer must not force using all 8
    assert dp_arrange([{1: 1.0, 8: 5.0}], FlatOperator(8)).units == (1,)


def test_bad_tasks_are_rejected():
    from tangram import ValidationError

    with pytest.raises(ValidationError):
        dp_arrange([{}], FlatOperator(4))
    with pytest.raises(ValidationError):
        dp_arrange([{1: math.nan}], FlatOperator(4))
    with pytest.raises(ValueError):
        FlatOperator(-1)
    with pytest.raises(ValueError):
        ChunkOperator({3: 1})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 16), min_size=1, max_size=6, unique=True),
    st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0]), min_size=6, max_size=6),
)
def test_one_task_shortcut_is_the_dp(amounts, durs):
    """`dp_table`'s one-task shortcut answers exactly what the numpy DP answers, ties included
    (durations drawn from a few values, so equal ones are common)."""
    task = (np.array(sorted(amounts), dtype=np.int64), np.array(durs[: len(amounts)]))
    op = FlatOperator(16)
    fast = dp_table([task], op)
    assert isinstance(fast, OneTask)
    slow = DPTable([task], op)
    assert fast.best(1) == slow.best(1) and fast.best(0) == slow.best(0)
