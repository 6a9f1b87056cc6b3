import pytest

from topology import (
    ChunkTree,
    CpuNode,
    InvariantViolation,
    TopologyError,
    build_chunk_graph,
    discover_gpus,
    discover_numa,
    parse_cpulist,
)


def test_buddy_split_and_merge():
    t = ChunkTree(8)
    assert t.allocate(2) == (0, 2)  # split 8 -> 4 + 2 + (2 used)
    assert t.free_counts() == {1: 0, 2: 1, 4: 1, 8: 0}
    assert t.allocate(1) == (2, 3)  # smallest free chunk holding 1 is the free 2
    assert t.free_counts() == {1: 1, 2: 0, 4: 1, 8: 0}
    t.release((0, 2))
    t.release((2, 3))
    assert t.free_counts() == {1: 0, 2: 0, 4: 0, 8: 1}


def test_allocate_prefers_score_among_equal_choices():
    t = ChunkTree(8)
    # any 2-chunk inside the free 8 is a valid outcome; the score picks (4, 6)
    assert t.allocate(2, score=lambda c: 1.0 if c == (4, 6) else 0.0) == (4, 6)
    t.verify()


def test_take_and_errors():
    t = ChunkTree(4)
    t.take((2, 3))
    with pytest.raises(TopologyError):
        t.take((2, 4))
    with pytest.raises(TopologyError):
        t.take((1, 3))  # not aligned
    with pytest.raises(TopologyError):
        t.release((0, 1))
    with pytest.raises(TopologyError):
        ChunkTree(6)
    with pytest.raises(TopologyError):
        t.allocate(8)


def test_verify_catches_corruption():
    t = ChunkTree(4)
    t.used.add((0, 1))
    with pytest.raises(InvariantViolation):
        t.verify()


def test_chunk_graph_levels():
    g = build_chunk_graph(8)
    assert g.number_of_nodes() == 15
    assert set(g.successors((0, 8))) == {(0, 4), (4, 8)}
    assert g.nodes[(6, 7)]["level"] == 0


def test_cpu_node_stays_in_one_numa_domain():
    n = CpuNode("n0", {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]})
    a = n.allocate(3)
    assert {n.domain_of[c] for c in a} == {0}
    b = n.allocate(2)  # best fit: domain 1 has 4 free, domain 0 has 1
    assert {n.domain_of[c] for c in b} == {1}
    c = n.allocate(3)  # no domain has 3 free: spans
    assert len(c) == 3 and n.free_count() == 0
    with pytest.raises(TopologyError):
        n.allocate(1)
    n.release(a)
    with pytest.raises(InvariantViolation):
        n.release(a)
    with pytest.raises(TopologyError):
        n.take([4])
    assert set(n.graph.successors("n0")) == {("numa", 0), ("numa", 1)}


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []


def test_discover_numa_covers_usable_cores(tmp_path):
    import os

    numa = discover_numa()
    cores = sorted(c for cs in numa.values() for c in cs)
    assert cores == sorted(os.sched_getaffinity(0))
    # a fake /sys with two domains
    for i, lst in enumerate(["0", "1"]):
        (tmp_path / f"node{i}").mkdir()
        (tmp_path / f"node{i}" / "cpulist").write_text(lst)
    fake = discover_numa(tmp_path)
    assert sum(len(v) for v in fake.values()) == len(os.sched_getaffinity(0))


def test_discover_gpus_never_raises():
    d = discover_gpus()
    assert d.gpus or d.reason  # no GPU here: an empty set and the reason
