"""The sharded scheduler (`tangram.runtime.shards`, docs/scale.md) on instances of the file
format's grammar (`tests/grammar.py`), the first flat pool made the per-node core pool whose
nodes split into shard processes (the others pooled, on the global shard): every action ends,
no node over capacity, no core or GPU shared at any instant, liveness (the independent checker
`grammar.check_run`). An action that needs the cores and a pooled resource together (a GPU
chunk) is refused at validation with a clear error, never decided half in a shard. Fresh
examples every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grammar import check_run, instance_docs
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.engine import Engine
from evaluation.simulator import Arrivals
from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram.errors import ValidationError
from tangram.instance import parse_instance
from tangram.pools import CorePool, FlatPool, Pool
from tangram.runtime.shards import ShardedScheduler
from topology import CpuNode

SCEN = Path(__file__).parents[1] / "scenarios"
KEPT = sorted(SCEN.glob("shards_*.json"))
# a solve per decision in a shard process: the exact policies are left to the simulator tests
POLICIES = [p for p in runtime_policies() if p not in ("cpsat", "pulp")]
EXAMPLES = 80
RAN: list[int] = []  # shards of each instance run through (the test below checks it is not 0)


def _cores(pools: dict[str, Pool]) -> tuple[dict[str, Pool], str | None]:
    """The first flat pool made the per-node core pool the shards split (the CPU manager's, in
    the runtime); every other pool stays pooled, on the global shard."""
    out, core = dict(pools), None
    for r, p in pools.items():
        if isinstance(p, FlatPool):
            nodes = {n: CpuNode(n, {0: tuple(range(p.capacity(n)))}) for n in p.nodes()}
            out[r], core = CorePool(r, nodes), r
            break
    return out, core


def _mixed(doc: dict, core: str | None) -> bool:
    """Some action needs the core pool and a pooled resource together."""
    return any(core in a["demand"] and len(a["demand"]) > 1 for a in doc["actions"])


def test_two_core_pools_are_refused_with_the_reason():
    """A first action's node would be chosen pool by pool (it stranded an action needing cores
    of one pool's node and of another's): one core pool is sharded, the rest is pooled."""
    pools = {r: CorePool(r, {"n0": CpuNode("n0", {0: (0, 1)})}) for r in ("cpu", "disk")}
    with pytest.raises(ValidationError, match="splits the nodes of one core pool"):
        ShardedScheduler(pools, get_allocator("heuristic"), shards=1, start=False)


def _project(draw, doc: dict, core: str | None) -> dict:
    """Most actions needing the cores and a pooled resource keep only their cores (an elastic
    one keyed on the dropped pool runs its `t_ori`): the shards then decide them; the rest stay
    mixed, for the refusal."""
    for a in doc["actions"]:
        if core not in a["demand"] or len(a["demand"]) == 1 or draw(st.integers(0, 5)) == 0:
            continue
        a["demand"] = {core: a["demand"][core]}
        a.pop("service", None)
        if a.get("key") not in (None, core):
            a["duration"] = a.pop("t_ori")
            del a["key"], a["efficiency"]
    return doc


def _run(doc: dict, policy: str) -> None:
    inst = parse_instance(doc)
    pools, core = _cores(inst.build_pools())
    nodes = {n for p in pools.values() if isinstance(p, CorePool) for n in p.nodes()}
    s = ShardedScheduler(pools, get_allocator(policy), shards=max(1, min(2, len(nodes))))
    try:
        for (t, r), n in inst.bindings.items():
            s.bind(t, r, n)
        if _mixed(doc, core):
            with pytest.raises(ValidationError, match="cores and pooled resources apart"):
                for a in inst.actions:
                    s.validate(a)
            return
        out = Engine(s, {}, timed=False).run(Arrivals(list(inst.actions)))
        RAN.append(len(s.layout.groups))
        findings = check_run(inst, out.records)
        assert not findings, (findings[:5], json.dumps(doc))
    finally:
        s.close()


@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_kept_counterexamples_run_on_the_shards(path, policy):
    _run(json.loads(path.read_text()), policy)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_sharded_scheduler_runs_every_instance_of_the_grammar_soundly(policy):
    @settings(max_examples=EXAMPLES, deadline=None)
    @given(doc=instance_docs(3, 8, services=False, min_nodes=2), data=st.data())
    def run(doc, data):
        core = next((r for r, s in doc["resources"].items() if s["topology"] == "flat"), None)
        _run(_project(data.draw, doc, core), policy)

    RAN.clear()
    run()
    assert sum(n > 1 for n in RAN) >= EXAMPLES // 8, RAN  # not every example refused or 1 shard
