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
)
from tangram.errors import Infeasible, ValidationError


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
