"""Every runtime policy the registry finds, on instances drawn from the file format's whole
grammar (`tests/grammar.py`: any pools of each topology, several nodes, node-bound actions,
every demand form over any subset of the pools, the elastic key on any pool, services, batch and
online arrivals), through the simulator: no exception, every action runs once with allowed units
on a placement of every pool it demands, no node over its capacity and no GPU shared at any
instant, something runs whenever work waits (liveness), and no action waits beside free units
it could use (work conservation, `tangram.conservation`). Fresh examples every run; the
counterexamples found so far are scenario files (`tests/scenarios/vector_*.json`), replayed
as `@example`s and through `tangram replay --json --check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grammar import check_run, instance_docs, multi_pool_docs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evaluation.replay import check_result, main
from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram.instance import load_instance, parse_instance
from tangram.pools import Placement
from tangram.results import ScheduledAction

SCEN = Path(__file__).parents[1] / "scenarios"
VECTOR = sorted(SCEN.glob("vector_*.json"))
POLICIES = runtime_policies()  # heuristic, backfill, backfill-srpt, min, cpsat, pulp, ...
EXACT = {"cpsat", "pulp"}  # a solve per decision: small instances, few examples
EXAMPLES = 400
EXACT_EXAMPLES = 30


def _kept(test):
    for path in VECTOR:
        test = example(doc=json.loads(path.read_text()))(test)
    return test


def _sound(doc: dict, policy: str, conserve: bool = True) -> None:
    inst = parse_instance(doc)
    result = simulate(inst, get_allocator(policy), conserve=conserve)
    findings = check_run(inst, result.records)
    assert not findings, (findings[:5], json.dumps(doc))
    if any("service" in a for a in doc["actions"]):
        return  # a deferral to a busy resident copy is a wait the schedule does not record
    report = check_result(inst, result)
    assert not report, ([(w.action_id, w.start, w.end) for w in report.intervals], json.dumps(doc))


def test_the_registry_finds_the_policies_this_speaks_of():
    assert {"heuristic", "backfill", "backfill-srpt", "min"} <= set(POLICIES)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_schedules_every_instance_of_the_grammar_soundly(policy):
    exact = policy in EXACT
    size = 4 if exact else 8

    @settings(max_examples=EXACT_EXAMPLES if exact else EXAMPLES, deadline=None)
    @given(doc=st.one_of(instance_docs(3, size), multi_pool_docs(size)))
    @_kept
    def run(doc):
        _sound(doc, policy)

    run()


@pytest.mark.parametrize("path", VECTOR, ids=[p.stem for p in VECTOR])
@pytest.mark.parametrize("policy", sorted(set(POLICIES) - EXACT))
def test_the_kept_vector_instances_replay_clean(path, policy, capsys):
    """`tangram replay --json --check`, as a user runs it: exit 0, every action placed on both
    of its pools."""
    assert main([str(path), "--allocator", policy, "--json", "--check"]) == 0
    doc = json.loads(capsys.readouterr().out)
    inst = load_instance(path)
    assert doc["conservation"]["intervals"] == []
    for a in inst.actions:
        assert set(doc["actions"][a.id]["units"]) == set(a.demands)


# -- the checker is not vacuous ---------------------------------------------------------------
TWO_POOLS = {
    "resources": {
        "cpu": {"topology": "flat", "units": 3},
        "gpu": {"topology": "chunks", "nodes": 1, "gpus_per_node": 2},
    },
    "actions": [
        {"id": "x", "demand": {"cpu": 2, "gpu": 1}, "duration": 1.0},
        {"id": "y", "demand": {"cpu": [1, 2], "gpu": 1}, "duration": 1.0},
    ],
}


def _recs(inst, **runs):
    """A schedule of `inst`: action id -> (start, end, cpu units, gpu chunk[, gpus])."""
    acts = {a.id: a for a in inst.actions}
    return {aid: _rec(acts[aid], *run) for aid, run in runs.items()}


def _rec(action, start, end, cpu, chunk, gpus=1):
    return ScheduledAction(
        action,
        0.0,
        start,
        end,
        {"cpu": cpu, "gpu": gpus},
        placement={"cpu": Placement("node0"), "gpu": Placement("gpu0", chunk=chunk)},
    )


def test_the_checker_finds_cores_over_capacity_a_shared_gpu_and_an_idle_wait():
    inst = parse_instance(TWO_POOLS)
    ok = _recs(inst, x=(0, 1, 2, (0, 1)), y=(1, 2, 1, (0, 1)))
    assert check_run(inst, ok) == []
    over = _recs(inst, x=(0, 1, 2, (0, 1)), y=(0.5, 1.5, 2, (1, 2)))
    assert any("cpu@node0 holds 4 of 3" in f for f in check_run(inst, over))
    shared = _recs(inst, x=(0, 1, 2, (0, 1)), y=(0, 1, 1, (0, 1)))
    assert any("GPU 0 held by" in f for f in check_run(inst, shared))
    idle = _recs(inst, x=(0, 1, 2, (0, 1)), y=(2, 3, 1, (0, 1)))
    assert any("wait and nothing runs" in f for f in check_run(inst, idle))
    unaligned = _recs(inst, x=(0, 1, 2, (1, 2)), y=(1, 2, 2, (0, 2)))  # 2 GPUs for 1
    assert any("chunk (0, 2) for 1 GPUs" in f for f in check_run(inst, unaligned))
    assert any("without a record" in f for f in check_run(inst, {"x": ok["x"]}))


def test_the_grammar_draws_what_the_format_allows():
    """The strategies reach every shape they claim: two pools of one topology, flat pools with
    named nodes, node-bound and service actions, every demand form, vector actions, keys on
    GPU pools, a batch and an online arrival pattern."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None)
    @given(doc=instance_docs())
    def run(doc):
        res = doc["resources"]
        flats = [r for r, s in res.items() if s["topology"] == "flat"]
        seen.update(
            k
            for k, hit in {
                "two flat pools": len(flats) >= 2,
                "two chunk pools": len(res) - len(flats) >= 2,
                "named nodes": any("nodes" in res[r] for r in flats),
                "services": any(s.get("services") for s in res.values()),
            }.items()
            if hit
        )
        for a in doc["actions"]:
            d = a["demand"].values()
            seen.update(
                k
                for k, hit in {
                    "node": "node" in a,
                    "service": "service" in a,
                    "int": any(isinstance(v, int) for v in d),
                    "list": any(isinstance(v, list) for v in d),
                    "range": any(isinstance(v, dict) for v in d),
                    "vector": len(a["demand"]) > 1,
                    "gpu key": a.get("key") in res and res[a["key"]]["topology"] == "chunks",
                }.items()
                if hit
            )
        times = [a["arrival"] for a in doc["actions"]]
        if len(times) > 1:
            seen.add("batch" if max(times) == 0 else "online")
        parse_instance(doc)  # valid by construction

    run()
    want = {
        "two flat pools",
        "two chunk pools",
        "named nodes",
        "services",
        "node",
        "service",
        "int",
        "list",
        "range",
        "vector",
        "gpu key",
        "batch",
        "online",
    }
    assert want <= seen, want - seen
