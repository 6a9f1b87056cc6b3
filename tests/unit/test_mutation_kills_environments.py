"""The environment record and table (`managers/cpu/environments.py`), checked where mutation
testing found a change no test noticed: what `settled` waits for, what `to` wakes, the running
count, the table's reservations and lookups."""

from __future__ import annotations

import asyncio

import pytest

from managers.cpu.environments import (
    Environment,
    EnvironmentTable,
    EnvRecord,
    EnvState,
    pick_node,
)
from tangram.errors import Infeasible, ValidationError
from tangram.pools import CorePool
from topology import CpuNode


def _env(i: int = 0, node: str = "n0", memory: int = 100, disk: int = 0) -> Environment:
    return Environment(f"env-{i}", f"t{i}", node, memory, f"/w{i}", disk_mb=disk)


@pytest.mark.parametrize("state", [EnvState.OPENING, EnvState.FREEZING, EnvState.RESETTING])
def test_settled_waits_while_settling_and_wakes_when_it_leaves(state):
    async def main():
        record = EnvRecord(_env(), state)
        waiter = asyncio.ensure_future(record.settled())
        await asyncio.sleep(0.01)
        waited = not waiter.done()
        record.to(EnvState.IDLE)
        await asyncio.wait_for(waiter, 1)
        return waited

    assert asyncio.run(main())


@pytest.mark.parametrize("state", [EnvState.IDLE, EnvState.RUNNING, EnvState.BROKEN])
def test_settled_returns_at_once_otherwise(state):
    async def main():
        await asyncio.wait_for(EnvRecord(_env(), state).settled(), 0.5)

    asyncio.run(main())


def test_a_removed_record_wakes_what_waits_for_it():
    async def main():
        table = EnvironmentTable({"n0": 1000})
        record = table.add(_env(), EnvState.OPENING)
        waiter = asyncio.ensure_future(record.settled())
        await asyncio.sleep(0.01)
        table.remove("env-0")
        await asyncio.wait_for(waiter, 1)
        return record.state

    assert asyncio.run(main()) is EnvState.CLOSED


def test_commands_count_and_the_last_one_leaves_it_idle():
    record = EnvRecord(_env(), EnvState.IDLE)
    record.command_started()
    record.command_started()
    assert (record.state, record.running) == (EnvState.RUNNING, 2)
    record.command_ended()
    assert (record.state, record.running) == (EnvState.RUNNING, 1)
    record.command_ended()
    assert (record.state, record.running) == (EnvState.IDLE, 0)
    record.to(EnvState.BROKEN, "gone")
    assert record.why == "gone"
    record2 = EnvRecord(_env(1), EnvState.IDLE)
    record2.to(EnvState.BROKEN)
    assert record2.why == "environment env-1 is broken"


def test_the_table_reserves_memory_and_disk_and_gives_them_back():
    table = EnvironmentTable({"n0": 1000, "n1": 500}, {"n0": 50})
    table.add(_env(0, "n0", 300, 20))
    assert (table.memory_free("n0"), table.disk_free("n0")) == (700, 30)
    assert table.memory_load("n0") == pytest.approx(0.3)
    with pytest.raises(ValidationError, match="already has environment env-0"):
        table.add(Environment("env-9", "t0", "n0", 1, "/w"))
    with pytest.raises(Infeasible, match="701"):
        table.add(_env(2, "n0", 701))
    assert table.of_trajectory("t0").id == "env-0" and table.binding("t0") == "n0"
    assert table.nodes == {"t0": "n0"} and len(table.nodes) == 1
    assert table.get("env-0") is table.record("env-0").env and table.get(5) is None
    assert [r.id for r in table.records()] == ["env-0"] and table.on_node("n1") == []
    table.remove("env-0")
    assert (table.memory_free("n0"), table.disk_free("n0")) == (1000, 50)
    assert table.of_trajectory("t0") is None and table.binding("t0") is None
    table.reserve_disk("n0", 10)
    assert table.disk_free("n0") == 40


def test_nodes_join_and_leave():
    table = EnvironmentTable({"n0": 100})
    table.add_node("n1", 200, 30)
    assert (table.memory_free("n1"), table.disk_free("n1")) == (200, 30)
    table.add(_env(0, "n1", 10))
    with pytest.raises(ValidationError, match="still holds"):
        table.remove_node("n1")
    table.remove("env-0")
    table.remove_node("n1")
    with pytest.raises(KeyError):
        table.memory_free("n1")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValidationError):
            table.add_node("n2", bad)
    with pytest.raises(ValidationError):
        EnvironmentTable({"n0": 0})


def _refused(call, field: str, value: object, problem: str) -> None:
    with pytest.raises(ValidationError) as got:
        call()
    assert (got.value.field, got.value.value, got.value.problem) == (field, value, problem)


POSITIVE = "must be a positive integer (MiB)"


def test_every_refusal_names_its_field_value_and_problem():
    _refused(lambda: EnvironmentTable({"n0": 0}), "memory_mb[n0]", 0, POSITIVE)
    _refused(lambda: EnvironmentTable({"n0": True}), "memory_mb[n0]", True, POSITIVE)
    EnvironmentTable({"n0": 1})  # the smallest size is one
    table = EnvironmentTable({"n0": 100})
    _refused(lambda: table.add_node("n1", 0), "memory_mb[n1]", 0, POSITIVE)
    _refused(lambda: table.add_node("n1", 2.0), "memory_mb[n1]", 2.0, POSITIVE)
    table.add_node("n1", 1)
    cores = CorePool("cpu", {"n0": CpuNode.flat("n0", 2), "n1": CpuNode.flat("n1", 2)})
    for bad in (0, -5, True, 1.5):
        _refused(lambda b=bad: table.choose_node(cores, b), "env.memory_mb", bad, POSITIVE)
    table.add(_env(0, "n0", 10))
    _refused(
        lambda: table.add(Environment("env-x", "t0", "n0", 1, "/w")),
        "env.trajectory",
        "t0",
        "already has environment env-0",
    )
    _refused(lambda: table.remove_node("n0"), "node", "n0", "still holds environments")


def test_lookups_of_a_value_that_is_no_id_answer_none():
    table = EnvironmentTable({"n0": 100})
    assert table.get(["env-0"]) is None and table.record({"a": 1}) is None  # (unhashable)


def test_the_default_disk_is_a_pebibyte_per_node():
    table = EnvironmentTable({"n0": 100})
    table.add_node("n1", 100)
    assert table.disk_free("n0") == table.disk_free("n1") == 1 << 40


def test_reservations_add_up_and_a_node_fits_exactly_its_free_memory():
    table = EnvironmentTable({"n0": 100}, {"n0": 10})
    table.add(_env(0, "n0", 60, 4))
    table.add(_env(1, "n0", 40, 6))  # exactly what is left
    assert table.memory_free("n0") == 0 and table.disk_free("n0") == 0
    assert table.record("env-1").state is EnvState.IDLE  # the default state of an added one


def test_settled_can_be_waited_for_again_after_it_woke():
    async def main():
        record = EnvRecord(_env(), EnvState.IDLE)
        for _ in range(2):
            record.to(EnvState.FREEZING)
            waiter = asyncio.ensure_future(record.settled())
            await asyncio.sleep(0.01)
            record.to(EnvState.IDLE)
            await asyncio.wait_for(waiter, 1)
        table = EnvironmentTable({"n0": 100})
        r = table.add(_env(1), EnvState.OPENING)
        first = asyncio.ensure_future(r.settled())
        await asyncio.sleep(0.01)
        table.remove("env-1")
        await asyncio.wait_for(first, 1)
        assert r._settled is None

    asyncio.run(main())


def test_pick_node_rules():
    free_mem = {"a": 100, "b": 100, "c": 50}.__getitem__
    load = {"a": 0.5, "b": 0.5, "c": 0.1}.__getitem__
    cores = {"a": 1, "b": 3, "c": 0}.__getitem__
    nodes = ["a", "b", "c"]
    # c has the memory exactly and the least load, but no free core: a ready node wins
    assert pick_node(nodes, free_mem, load, cores, 50) == "b"  # equal load: more free cores
    assert pick_node(["a", "c"], free_mem, load, cores, 50) == "a"  # one free core is enough
    assert pick_node(["c"], free_mem, load, cores, 50) == "c"  # none ready: any with memory
    assert pick_node(nodes, free_mem, load, cores, 100) == "b"  # exactly the free memory fits
    assert pick_node(nodes, free_mem, load, cores, 101) is None


def test_choose_node_names_the_best_it_had_when_nothing_fits():
    table = EnvironmentTable({"n0": 100, "n1": 300}, {"n0": 20, "n1": 10})
    cores = CorePool("cpu", {"n0": CpuNode.flat("n0", 2), "n1": CpuNode.flat("n1", 2)})
    assert table.choose_node(cores, 100, disk_mb=20) == "n0"  # exactly the free disk fits
    with pytest.raises(
        Infeasible, match=r"env.disk_mb: 21 MiB fits on no node \(most free: 20 MiB on n0\)"
    ):
        table.choose_node(cores, 1, disk_mb=21)
    with pytest.raises(
        Infeasible, match=r"env.memory_mb: 301 MiB fits on no node \(most free: 300 MiB on n1\)"
    ):
        table.choose_node(cores, 301)
    with pytest.raises(Infeasible, match="none of the 2 takes new environments"):
        table.choose_node(cores, 1, exclude=("n0", "n1"))
    assert table.choose_node(cores, 1, exclude=("n1",)) == "n0"
    assert table.choose_node(cores, 250) == "n1"


def test_choose_node_min_cores_and_disk_defaults():
    table = EnvironmentTable({"a": 1000, "b": 1000}, {"a": 0, "b": 0})
    pool = CorePool("cpu", {"a": CpuNode.flat("a", 2), "b": CpuNode.flat("b", 2)})
    pool.place(1, node="a")  # a: one core free
    table.add(_env(9, "b", 500))  # b: more memory loaded, both cores free
    assert table.choose_node(pool, 10) == "a"  # one free core is enough by default; no disk
    assert table.choose_node(pool, 10, min_cores=2) == "b"  # two asked: the node with two


def test_the_most_free_is_named_by_its_memory_not_its_name():
    table = EnvironmentTable({"a": 300, "b": 100})
    pool = CorePool("cpu", {"a": CpuNode.flat("a", 1), "b": CpuNode.flat("b", 1)})
    with pytest.raises(Infeasible, match=r"most free: 300 MiB on a\)"):
        table.choose_node(pool, 301)
