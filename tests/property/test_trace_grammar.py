"""A schedule's trace (`tangram/trace.py`) over every shape the instance file allows (pools,
nodes, chunk pools, vector demands, services, arrivals: tests/grammar.py), through every policy
the registry finds: the trace is well-formed, no core, GPU or slot holds two slices at once,
and each record is there once per unit it held."""

from __future__ import annotations

import pytest
from grammar import instance_docs, multi_pool_docs
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram.instance import parse_instance
from tangram.trace import TRAJECTORIES, check_trace, chrome_trace

POLICIES = sorted(runtime_policies())


@pytest.mark.parametrize("policy", POLICIES)
def test_every_schedule_of_the_grammar_traces_cleanly(policy):
    @settings(max_examples=25, deadline=None)
    @given(doc=st.one_of(instance_docs(3, 8), multi_pool_docs(8)))
    def run(doc):
        result = simulate(parse_instance(doc), get_allocator(policy))
        trace = chrome_trace(result.records.values())
        assert check_trace(trace) == []
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"
                 and e["name"] == "process_name"}  # fmt: skip
        held = [e for e in trace["traceEvents"] if e["ph"] == "X"
                and names[e["pid"]] != TRAJECTORIES]  # fmt: skip
        assert len(held) == sum(sum(r.units.values()) for r in result.records.values())

    run()
