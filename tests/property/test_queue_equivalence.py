"""The indexed queue (`tangram.queue.ActionQueue`, what the scheduler always passes) and a plain
sequence of the same actions give every queue-order policy the same decision: same actions,
units and placements, on instances of the file format's grammar (`tests/grammar.py`) with some
pools busy. The index is an optimisation; the FCFS rule is the plain walk's (an action waiting
behind a blocked pool blocks its other pools too: a vector action waiting for cores keeps its
place on the API slots). Fresh examples every run."""

from __future__ import annotations

import json

import pytest
from grammar import instance_docs
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram.errors import Infeasible
from tangram.instance import parse_instance
from tangram.scheduler import Scheduler

POLICIES = [p for p in runtime_policies() if p not in ("cpsat", "pulp")]  # a solve each


def _grants(assignments) -> list[tuple]:
    return sorted(
        (a.action.id, tuple(sorted(a.units.items())), tuple(sorted(a.placement.items())))
        for a in assignments
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_a_policy_decides_alike_on_the_indexed_queue_and_on_a_plain_sequence(policy):
    @settings(max_examples=300, deadline=None)
    @given(doc=instance_docs(3, 10, services=False), data=st.data())
    def run(doc, data):
        inst = parse_instance(doc)
        pools = inst.build_pools()
        busy = data.draw(st.integers(0, len(inst.actions)))
        for a in inst.actions[:busy]:  # what runs already: its minimum, where it fits
            try:
                for r, k in a.mins.items():
                    pools[r].place(k, inst.bindings.get((a.trajectory, r)))
            except Infeasible:
                pass
        s = Scheduler(pools, get_allocator(policy), conserve=False)
        for (t, r), n in inst.bindings.items():
            s.bind(t, r, n)
        for a in inst.actions[busy:]:
            s.submit(a)
        view, alloc = s.view(), s.allocator
        indexed = _grants(alloc.allocate(view, s.queue, 0.0))
        plain = _grants(alloc.allocate(view, list(s.queue), 0.0))
        assert indexed == plain, json.dumps(doc)

    run()
