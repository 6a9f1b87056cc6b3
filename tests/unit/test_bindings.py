"""`tangram.bindings.Bindings`: one record of trajectory -> node. Attached, it answers with the
environments' own table (no copy to drift); unattached resources are bound in it directly."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from managers.cpu.environments import Environment, EnvironmentTable
from tangram.bindings import Bindings
from tangram.errors import Infeasible, InvariantError, ValidationError
from tangram.pools import CorePool
from tangram.runtime.facade import Tangram
from topology import CpuNode

TRAJ = st.sampled_from([f"t{i}" for i in range(6)])
NODE = st.sampled_from(["a", "b", "c"])
STEP = st.one_of(
    st.tuples(st.just("open"), TRAJ, NODE),  # an environment opens in the table
    st.tuples(st.just("close"), TRAJ, NODE),  # the trajectory's environment closes
    st.tuples(st.just("bind"), TRAJ, NODE),  # a binding on the unowned resource `api`
    st.tuples(st.just("unbind"), TRAJ, NODE),
)


@settings(max_examples=60)
@given(steps=st.lists(STEP, max_size=40))
def test_an_attached_table_is_the_answer_and_own_binds_stay_apart(steps):
    table = EnvironmentTable({"a": 10_000, "b": 10_000, "c": 10_000})
    b = Bindings()
    b.bind("t0", "cpu", "a")  # bound before the owner attached: the owner's record wins
    b.attach("cpu", table.nodes)
    model_cpu: dict[str, str] = {}
    model_api: dict[str, str] = {}
    for i, (op, t, n) in enumerate(steps):
        if op == "open" and t not in model_cpu:
            table.add(Environment(f"e{i}", t, n, 100, workdir=""))
            model_cpu[t] = n
        elif op == "close" and t in model_cpu:
            table.remove(table.of_trajectory(t).id)
            del model_cpu[t]
        elif op == "bind":
            b.bind(t, "api", n)
            model_api[t] = n
        elif op == "unbind":
            b.unbind(t)  # drops its own binds; the owner's stay until the environment closes
            model_api.pop(t, None)
        expected = {
            **{(t, "cpu"): n for t, n in model_cpu.items()},
            **{(t, "api"): n for t, n in model_api.items()},
        }
        assert dict(b) == expected and len(b) == len(expected)
        assert all(b.get(k) == v and k in b for k, v in expected.items())


def test_a_binding_that_disagrees_with_the_environment_is_an_invariant_error():
    table = EnvironmentTable({"a": 1000, "b": 1000})
    table.add(Environment("e1", "t1", "a", 100, workdir=""))
    b = Bindings()
    b.attach("cpu", table.nodes)
    b.bind("t1", "cpu", "a")  # agrees: nothing to do
    with pytest.raises(InvariantError, match="t1.*environment is on a"):
        b.bind("t1", "cpu", "b")


def test_the_runtime_scheduler_reads_the_managers_environments():
    cpu = CpuManager(
        SimCpuBackend(),
        nodes={"n0": CpuNode("n0", {0: (0, 1)}), "n1": CpuNode("n1", {0: (0, 1)})},
        memory_mb={"n0": 4096, "n1": 4096},
    )
    tg = Tangram(cpu=cpu, policy="heuristic")

    async def go():
        async with tg:
            envs = [await tg.open_env(f"t{i}", memory_mb=1024) for i in range(3)]
            seen = (dict(tg.scheduler.bindings), cpu.bindings())
            await tg.close_env(envs[0])
            return seen, (dict(tg.scheduler.bindings), cpu.bindings())

    (seen, own), (after, own_after) = asyncio.run(go())
    assert seen == own and len(seen) == 3 and set(seen.values()) == {"n0", "n1"}
    assert ("t0", "cpu") not in after and after == own_after and len(after) == 2
    assert tg.scheduler.bindings.owner("cpu") is cpu.trajectory_nodes


def test_the_table_takes_nodes_joining_and_leaving_and_never_chooses_an_excluded_one():
    """Ray's membership through the one node-choice rule: a joining node is chosen when it
    is the least loaded, a lost (excluded) one never, and a node leaves only when empty."""
    cores = CorePool("cpu", {n: CpuNode(n, {0: (0, 1)}) for n in ("a", "b")})
    table = EnvironmentTable({})
    table.add_node("a", 1000)
    table.add(Environment("e1", "t1", "a", 500, workdir=""))
    table.add_node("b", 1000)
    assert table.choose_node(cores, 100) == "b"  # the least memory-loaded
    assert table.choose_node(cores, 100, exclude={"b"}) == "a"
    with pytest.raises(Infeasible, match="none of the 2 takes new environments"):
        table.choose_node(cores, 100, exclude={"a", "b"})
    with pytest.raises(ValidationError, match="still holds environments"):
        table.remove_node("a")
    table.remove(table.of_trajectory("t1").id)
    table.remove_node("a")
    assert table.choose_node(cores, 100) == "b" and "a" not in dict(table.nodes).values()
