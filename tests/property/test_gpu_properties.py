"""Properties of the GPU pool logic under random service calls: memory never overflows, no GPU
runs two actions, chunk trees stay valid, and restore decisions agree with the cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from managers.gpu import GB, RandomEviction, Residency, Service, ServiceRegistry
from tangram.actions import Action
from tangram.errors import Infeasible, InvariantError
from tangram.pools import ChunkPool
from topology import ChunkTree

MEM = 80 * GB

services_st = st.lists(
    st.tuples(st.integers(5, 80), st.sampled_from([(1,), (1, 2), (2, 4), (1, 2, 4, 8)])),
    min_size=1,
    max_size=6,
)
ops_st = st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), min_size=1, max_size=80)


def build(specs, nodes: int, gpus: int, random_eviction: bool):
    reg = ServiceRegistry(
        {f"s{i}": Service.uniform(f"s{i}", gb * GB, dops) for i, (gb, dops) in enumerate(specs)}
    )
    names = {f"n{i}": gpus for i in range(nodes)}
    r = Residency.uniform(names, MEM, reg, eviction=RandomEviction(1) if random_eviction else None)
    pool = ChunkPool("gpu", {n: ChunkTree(g, n) for n, g in names.items()})
    return r, pool


def check(r: Residency, pool: ChunkPool, running) -> None:
    r.verify()
    for n in pool.nodes():
        pool.tree(n).verify()
        for g in range(r.num_gpus(n)):
            assert 0 <= r.used_bytes(n, g) <= r.memory_bytes(n, g)
    owners: dict[tuple[str, int], str] = {}
    for a, where in running.values():
        for g in range(*where.chunk):
            assert (where.node, g) not in owners, "two actions on one GPU"
            owners[(where.node, g)] = a.id
            assert r.busy(where.node, g) == a.id


@settings(max_examples=60, deadline=None)
@given(
    services_st,
    ops_st,
    st.integers(1, 3),
    st.sampled_from([1, 2, 4, 8]),
    st.booleans(),
    st.booleans(),
)
def test_random_service_calls_keep_every_invariant(specs, ops, nodes, gpus, prefer, rnd) -> None:
    r, pool = build(specs, nodes, gpus, rnd)
    running: dict[str, tuple[Action, object]] = {}
    now = 0.0
    for i, (start, pick) in enumerate(ops):
        now += 1.0
        if start or not running:
            name = f"s{pick % len(specs)}"
            dops = [k for k in r.registry.get(name).dops if k <= gpus]
            if not dops:
                continue
            a = Action(f"a{i}", {"gpu": dops[pick % len(dops)]}, duration=1.0, service=name)
            k = a.demands["gpu"].min
            before = r.is_resident
            try:
                where = pool.place(
                    k, prefer=(lambda n, c, a=a: r.prefer(a, "gpu", n, c)) if prefer else None
                )
            except Infeasible:
                continue
            was_resident = before(name, where.node, where.chunk)
            d = r.begin(a, where.node, where.chunk, now)
            assert d.restored == (not was_resident)
            assert r.is_resident(name, where.node, where.chunk)
            for e in d.evicted:
                assert not r.is_resident(e.service, e.node, e.chunk)
            running[a.id] = (a, where)
        else:
            aid = sorted(running)[pick % len(running)]
            a, where = running.pop(aid)
            r.end(a, where.node, where.chunk, now)
            pool.release(where, where.chunk[1] - where.chunk[0])
        check(r, pool, running)


@settings(max_examples=40, deadline=None)
@given(
    services_st,
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 99)), min_size=1, max_size=40
    ),
)
def test_direct_begin_on_busy_gpus_is_refused_without_side_effects(specs, calls) -> None:
    """Bypassing the chunk pool: a begin that would share a GPU raises and changes nothing."""
    r, _ = build(specs, 1, 8, False)
    for i, (level, slot, pick) in enumerate(calls):
        size = 1 << level
        start = (slot * size) % 8
        chunk = (start, start + size)
        name = f"s{pick % len(specs)}"
        if size not in r.registry.get(name).dops:
            continue
        a = Action(f"a{i}", {"gpu": size}, duration=1.0, service=name)
        busy = [r.busy("n0", g) for g in range(*chunk)]
        used = [r.used_bytes("n0", g) for g in range(8)]
        entries = set(r.entries())
        if any(b is not None for b in busy):
            try:
                r.begin(a, "n0", chunk, float(i))
            except InvariantError:
                assert [r.used_bytes("n0", g) for g in range(8)] == used
                assert set(r.entries()) == entries
            else:
                raise AssertionError(f"{a.id} began on busy GPUs {chunk}")
        else:
            r.begin(a, "n0", chunk, float(i))
        r.verify()
