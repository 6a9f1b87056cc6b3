"""Disk in the environments' node choice (pure pool logic): an environment is placed only where
its disk fits, and reservations of environments and frozen layers are counted and come back
exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from managers.cpu.environments import Environment, EnvironmentTable
from tangram.errors import Infeasible
from tangram.pools import CorePool
from topology import CpuNode

NODES = {"a": CpuNode("a", {0: (0, 1)}), "b": CpuNode("b", {0: (0, 1)})}


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["open", "close", "freeze"]), st.integers(1, 400)), max_size=40
    ),
    cap=st.integers(100, 1000),
)
def test_disk_reservations_fit_and_return(ops: list[tuple[str, int]], cap: int) -> None:
    pool = CorePool("cpu", NODES)
    table = EnvironmentTable({"a": 1 << 20, "b": 1 << 20}, {"a": cap, "b": cap})
    frozen: list[tuple[str, int]] = []
    n = 0
    for op, mb in ops:
        if op == "open":
            n += 1
            try:
                node = table.choose_node(pool, 1, 1, disk_mb=mb)
            except Infeasible:
                assert all(table.disk_free(x) < mb for x in ("a", "b"))
                continue
            assert table.disk_free(node) >= mb
            table.add(Environment(f"e{n}", f"t{n}", node, 1, "/w", disk_mb=mb))
        elif op == "close" and table.all():
            table.remove(table.all()[0].id)
        elif op == "freeze" and table.all():
            node = table.all()[-1].node
            table.reserve_disk(node, mb % 50)
            frozen.append((node, mb % 50))
        for x in ("a", "b"):
            envs = sum(e.disk_mb for e in table.all() if e.node == x)
            assert table.disk_reserved[x] == envs + sum(m for f, m in frozen if f == x)
    for e in table.all():
        table.remove(e.id)
    for node, mb in frozen:
        table.reserve_disk(node, -mb)
    assert table.disk_reserved == {"a": 0, "b": 0}


def test_disk_that_fits_nowhere_is_infeasible_naming_it() -> None:
    pool = CorePool("cpu", NODES)
    table = EnvironmentTable({"a": 1024, "b": 1024}, {"a": 100, "b": 50})
    with pytest.raises(Infeasible, match="env.disk_mb: 101 MiB fits on no node"):
        table.choose_node(pool, 1, 1, disk_mb=101)
    assert table.choose_node(pool, 1, 1, disk_mb=80) == "a"
