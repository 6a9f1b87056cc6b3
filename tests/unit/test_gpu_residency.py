"""The residency cache: hits, LRU eviction, memory accounting, preference, loud failures."""

from __future__ import annotations

import pytest

from managers.gpu import GB, RandomEviction, Residency, RestoreModel, Service, ServiceRegistry
from tangram.actions import Action
from tangram.errors import InvariantError, ValidationError
from tangram.pools import ChunkPool
from topology import ChunkTree


def act(aid: str, service: str, k: int = 1) -> Action:
    return Action(aid, {"gpu": k}, duration=1.0, service=service)


def residency(gpus: int = 1, mem_gb: int = 80, nodes: int = 1, **services: int) -> Residency:
    reg = ServiceRegistry(
        {n: Service.uniform(n, gb * GB, (1, 2, 4), restore_s=2.0) for n, gb in services.items()}
    )
    return Residency.uniform({f"g{i}": gpus for i in range(nodes)}, mem_gb * GB, reg)


def run(r: Residency, a: Action, node: str, chunk, now: float):
    d = r.begin(a, node, chunk, now)
    r.end(a, node, chunk, now + 1)
    return d


def test_alternating_60gb_on_one_80gb_gpu_restores_every_time() -> None:
    r = residency(A=60, B=60)
    decisions = [run(r, act(f"x{i}", "AB"[i % 2]), "g0", (0, 1), 10.0 * i) for i in range(6)]
    assert [d.restored for d in decisions] == [True] * 6
    evicted = [[e.service for e in d.evicted] for d in decisions]
    assert evicted == [[]] + [["A"], ["B"]] * 2 + [["A"]]
    assert all(d.restore_s == 2.0 for d in decisions)
    assert r.used_bytes("g0", 0) == 60 * GB


def test_alternating_on_two_gpus_restores_only_first_call_of_each() -> None:
    r = residency(gpus=2, A=60, B=60)
    pool = ChunkPool("gpu", {"g0": ChunkTree(2, "g0")})
    restored = []
    for i in range(6):
        a = act(f"x{i}", "AB"[i % 2])
        where = pool.place(1, prefer=lambda n, c, a=a: r.prefer(a, "gpu", n, c))
        restored.append(run(r, a, where.node, where.chunk, 10.0 * i).restored)
        pool.release(where, 1)
    assert restored == [True, True, False, False, False, False]


def test_lru_evicts_least_recently_used_and_hits_refresh() -> None:
    r = residency(A=30, B=30, C=30)
    run(r, act("1", "A"), "g0", (0, 1), 0)
    run(r, act("2", "B"), "g0", (0, 1), 10)
    assert not run(r, act("3", "A"), "g0", (0, 1), 20).restored  # hit, A now newer than B
    d = run(r, act("4", "C"), "g0", (0, 1), 30)
    assert [e.service for e in d.evicted] == ["B"]
    assert r.is_resident("A", "g0", (0, 1)) and not r.is_resident("B", "g0", (0, 1))


def test_eviction_frees_a_wide_entry_on_all_its_gpus() -> None:
    r = residency(gpus=2, X=50, Y=50)
    run(r, act("1", "X", 2), "g0", (0, 2), 0)
    assert (r.used_bytes("g0", 0), r.used_bytes("g0", 1)) == (50 * GB, 50 * GB)
    d = run(r, act("2", "Y"), "g0", (1, 2), 5)
    assert [e.chunk for e in d.evicted] == [(0, 2)]
    assert (r.used_bytes("g0", 0), r.used_bytes("g0", 1)) == (0, 50 * GB)


def test_variants_are_distinct_services() -> None:
    r = residency(gpus=2, X=30)
    run(r, act("1", "X", 2), "g0", (0, 2), 0)
    assert run(r, act("2", "X", 1), "g0", (0, 1), 5).restored  # the 1-GPU variant is another
    assert r.used_bytes("g0", 0) == 60 * GB


def test_two_actions_on_one_gpu_raise_and_leave_state_unchanged() -> None:
    r = residency(gpus=2, A=10, B=10)
    r.begin(act("1", "A", 2), "g0", (0, 2), 0)
    with pytest.raises(InvariantError, match="gpu1: runs 1"):
        r.begin(act("2", "B"), "g0", (1, 2), 0)
    assert r.busy("g0", 1) == "1" and not r.is_resident("B", "g0", (1, 2))


def test_end_of_an_action_not_running_there_raises() -> None:
    r = residency(A=10)
    with pytest.raises(InvariantError, match="not running"):
        r.end(act("1", "A"), "g0", (0, 1), 0)


def test_misaligned_chunk_and_unknown_service_raise() -> None:
    r = residency(gpus=4, A=10)
    with pytest.raises(InvariantError, match="aligned"):
        r.begin(act("1", "A", 2), "g0", (1, 3), 0)
    with pytest.raises(ValidationError, match="unknown service"):
        r.begin(act("2", "nope"), "g0", (0, 1), 0)


def test_a_service_larger_than_a_gpu_is_refused_at_registration() -> None:
    r = residency(A=10)
    with pytest.raises(ValidationError, match="memory_bytes"):
        r.register(Service.uniform("big", 81 * GB))


def test_prefer_ranks_resident_then_free_then_oldest_victim() -> None:
    r = residency(gpus=4, A=60, B=60, C=60)
    run(r, act("1", "A"), "g0", (0, 1), 0)
    run(r, act("2", "B"), "g0", (1, 2), 10)
    a, c = act("3", "A"), act("4", "C")
    assert r.prefer(a, "gpu", "g0", (0, 1)) == 2.0
    assert r.prefer(a, "gpu", "g0", (2, 3)) == 1.0
    assert r.prefer(c, "gpu", "g0", (0, 1)) > r.prefer(c, "gpu", "g0", (1, 2))  # A is older
    assert r.prefer(c, "gpu", "g0", (1, 2)) < 1.0
    assert r.prefer(act("5", "A"), "cpu", "g0", (0, 1)) == 0.0
    assert r.prefer(Action("6", {"gpu": 1}, duration=1.0), "gpu", "g0", (0, 1)) == 0.0


def test_restore_time_from_bytes_and_bandwidth_when_not_declared() -> None:
    reg = ServiceRegistry({"S": Service.sharded("S", 64 * GB, dops=(1, 2))})
    r = Residency.uniform({"g0": 2}, 80 * GB, reg, restore=RestoreModel(32.0, 0.5))
    assert run(r, act("1", "S", 2), "g0", (0, 2), 0).restore_s == pytest.approx(0.5 + 1.0)
    assert run(r, act("2", "S", 1), "g0", (0, 1), 5).restore_s == pytest.approx(0.5 + 2.0)


def test_random_eviction_is_seeded_and_only_picks_resident_entries() -> None:
    picks = []
    for _ in range(2):
        reg = ServiceRegistry({n: Service.uniform(n, 30 * GB) for n in "ABCD"})
        r = Residency.uniform({"g0": 1}, 80 * GB, reg, eviction=RandomEviction(7))
        picks.append(
            [
                [e.service for e in run(r, act(f"{i}", s), "g0", (0, 1), i).evicted]
                for i, s in enumerate("ABCDABCD")
            ]
        )
    assert picks[0] == picks[1]


def test_wait_for_a_busy_resident_copy_only_while_it_beats_a_restore() -> None:
    """A's copy on g0 (0, 1) is busy until t = 0.5; a restore of A takes 2 s. The first waiter
    waits (0.5 s < 2 s), so does the second (0.5 + 1 inference of 1 s), the third would wait
    2.5 s and restores instead. A resident chunk never defers; B has no copy to wait for."""
    r = residency(gpus=2, A=30, B=30)
    r.begin(act("x0", "A"), "g0", (0, 1), 0.0)
    busy = [("g0", (0, 1), 0.5)]
    claimed: dict = {}
    waits = [
        r.should_wait(act(f"w{i}", "A"), "gpu", "g0", (1, 2), busy, 0.0, claimed, 1.0)
        for i in range(3)
    ]
    assert waits == [True, True, False]
    assert not r.should_wait(act("b", "B"), "gpu", "g0", (1, 2), busy, 0.0, {}, 1.0)
    assert not r.should_wait(act("a", "A"), "gpu", "g0", (0, 1), busy, 0.0, {}, 1.0)
    assert not r.should_wait(act("c", "A"), "gpu", "g0", (1, 2), [("g0", (0, 1), 5.0)], 0.0)
