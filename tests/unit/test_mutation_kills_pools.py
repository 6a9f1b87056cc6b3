"""`tangram.pools` at its edges (mutation testing, docs/mutation.md): membership (a retiring
GPU node leaves when idle and takes no other node with it; a CPU node joins once and leaves
only idle), empty pools, unknown nodes, a node's own operator, the advisor kept by a copy, and
the checks of the arguments."""

from __future__ import annotations

import pytest

from tangram.errors import Infeasible, ValidationError
from tangram.pools import ChunkPool, CorePool, FlatPool, PlacementAdvisor
from topology import ChunkTree, CpuNode


def gpus(*nodes: str) -> ChunkPool:
    return ChunkPool("gpu", {n: ChunkTree(2, n) for n in nodes})


def test_a_retiring_node_leaves_when_its_last_chunk_returns_and_alone():
    pool = gpus("g0", "g1")
    held0 = pool.place(1, "g0")
    held1 = pool.place(1, "g1")
    pool.retire("g0")
    assert pool.nodes() == ["g0", "g1"] and pool.free("g0") == 0
    assert pool.fits(1, "g0") is None
    pool.release(held1, 1)  # g1 is idle now, but not retiring: it stays
    assert pool.nodes() == ["g0", "g1"]
    pool.release(held0, 1)
    assert pool.nodes() == ["g1"] and pool.free() == 2
    with pytest.raises(ValidationError) as e:
        pool.retire("g9")
    assert (e.value.field, e.value.value) == ("gpu.nodes", "g9")


def test_a_copy_keeps_the_pools_advisor():
    class Advice(PlacementAdvisor):
        def prefer(self, action, node, chunk):
            return 0.0

        def defer(self, action, placement, view, now):
            return False

    advice = Advice()
    for pool in (gpus("g0"), FlatPool("api", {"n0": 1}), CorePool("cpu", {})):
        pool.advisor = advice
        assert pool.copy().advisor is advice


@pytest.mark.parametrize(
    "pool", [gpus(), FlatPool("api", {}), CorePool("cpu", {})], ids=["chunk", "flat", "core"]
)
def test_an_empty_pool_places_nothing_and_refuses_every_demand(pool):
    assert pool.largest_request() == 0
    assert pool.free() == 0 and pool.capacity() == 0
    with pytest.raises(Infeasible):
        pool.validate_amounts("demand", [1])


def test_gpu_amounts_must_be_powers_of_two():
    with pytest.raises(ValidationError) as e:
        gpus("g0").validate_amounts("d.gpu", [3])
    assert (e.value.field, e.value.value) == ("d.gpu", 3)


def test_a_cpu_node_joins_once_and_leaves_only_idle():
    pool = CorePool("cpu", {"n0": CpuNode("n0", {0: (0, 1)})})
    pool.add_node(CpuNode("n1", {0: (0, 1, 2)}))
    assert pool.nodes() == ["n0", "n1"] and pool.free("n1") == 3 and pool.largest_request() == 3
    with pytest.raises(ValidationError) as e:
        pool.add_node(CpuNode("n1", {0: (0,)}))
    assert (e.value.field, e.value.value) == ("cpu.nodes", "n1")
    assert pool.capacity("n1") == 3
    held = pool.place(2, "n1")
    with pytest.raises(ValidationError) as e:
        pool.remove_node("n1")
    assert (e.value.field, e.value.value) == ("cpu.nodes", "n1")
    assert "n1" in pool.nodes()
    pool.release(held, 2)
    pool.remove_node("n1")
    assert pool.nodes() == ["n0"]
    with pytest.raises(ValidationError) as e:
        pool.remove_node("n1")
    assert (e.value.field, e.value.value) == ("cpu.nodes", "n1")


@pytest.mark.parametrize("bad", [-1, 2.5, True, "3", None])
def test_flat_units_must_be_non_negative_integers(bad):
    with pytest.raises(ValidationError) as e:
        FlatPool("api", {"n0": bad})
    assert e.value.field == "resources.api.units" and e.value.value == bad


def test_an_unknown_node_fits_nothing():
    pool = FlatPool("api", {"n0": 2})
    assert pool.fits(1, "nope") is None and pool.fits(0, "nope") is None
    with pytest.raises(Infeasible):
        pool.place(1, "nope")


def test_a_nodes_operator_counts_that_nodes_free_units():
    pool = FlatPool("api", {"n0": 2, "n1": 5})
    pool.place(1, "n1")
    assert pool.operator("n0").units == 2
    assert pool.operator("n1").units == 4
    assert pool.operator().units == 6
    cores = CorePool("cpu", {n: CpuNode(n, {0: tuple(range(c))}) for n, c in (("a", 2), ("b", 3))})
    assert cores.operator("a").units == 2 and cores.operator().units == 5
