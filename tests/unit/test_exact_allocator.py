"""The receding-horizon exact policies `cpsat` and `pulp` on hand-built cluster views."""

import pytest

from solvers import get_allocator
from solvers.exact import CpSatAllocator, ExactAllocator, PulpAllocator
from solvers.exact import allocator as exact_allocator
from solvers.exact.backend import NoSchedule
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView, RunningAction, check_assignments
from tangram.errors import TangramError
from tangram.pools import ChunkPool, CorePool, Placement
from tangram.scheduler import Scheduler
from topology import ChunkTree, CpuNode


def gpu_view_with_a_running_half():
    pool = ChunkPool("gpu", {"g0": ChunkTree(4, "g0")})
    running = Action("r", {"gpu": 2}, duration=1.0)
    placement = Placement("g0", chunk=(0, 2))
    pool.take(placement, 2)
    ra = RunningAction(Assignment(running, {"gpu": 2}, {"gpu": placement}), 0.0, 1.0)
    return ClusterView({"gpu": pool}, [ra])


@pytest.mark.parametrize("name", ["cpsat", "pulp"])
def test_starts_what_the_optimal_plan_starts_now(name):
    # B (2 GPUs, 2 s) now on the free half, then A (4 GPUs, 1 s) at 2: 2 + 3 = 5.
    # A first (at 1, when r ends) then B: 2 + 4 = 6. Waiting for everything is worse still.
    view = gpu_view_with_a_running_half()
    a = Action("A", {"gpu": 4}, duration=1.0)
    b = Action("B", {"gpu": 2}, duration=2.0)
    out = get_allocator(name).allocate(view, [a, b], now=0.0)
    assert [x.action.id for x in out] == ["B"]
    assert out[0].placement["gpu"].chunk == (2, 4)


def test_waits_when_starting_now_would_be_worse():
    # A (4 GPUs, 1 s) alone in the queue: it cannot start before r ends, so nothing starts now
    view = gpu_view_with_a_running_half()
    assert (
        get_allocator("cpsat").allocate(view, [Action("A", {"gpu": 4}, duration=1.0)], now=0.0)
        == []
    )


def test_core_pool_gets_concrete_cores_that_pass_the_checker():
    pool = CorePool("cpu", {"n0": CpuNode("n0", {0: range(4), 1: range(4, 8)})})
    queue = [
        Action(f"c{i}", {"cpu": [1, 2, 4]}, submit_time=0.0, elasticity=None, duration=1.0)
        for i in range(3)
    ]
    view = ClusterView({"cpu": pool})
    out = get_allocator("cpsat").allocate(view, queue, now=0.0)
    assert {x.action.id for x in out} == {"c0", "c1", "c2"}
    assert all(len(x.placement["cpu"].cores) == x.units["cpu"] for x in out)
    check_assignments({"cpu": pool}, out)


def test_window_limits_what_one_decision_sees():
    view = ClusterView({"gpu": ChunkPool("gpu", {"g0": ChunkTree(4, "g0")})})
    queue = [Action(f"x{i}", {"gpu": 1}, duration=1.0) for i in range(4)]
    out = ExactAllocator(window=2).allocate(view, queue, now=0.0)
    assert {x.action.id for x in out} == {"x0", "x1"}


def test_registry_names_and_options():
    assert isinstance(get_allocator("cpsat"), CpSatAllocator)
    assert get_allocator("pulp").backend == "pulp-cbc"
    assert isinstance(get_allocator("pulp", backend="pulp-highs"), PulpAllocator)
    with pytest.raises(TangramError):
        get_allocator("cpsat", backend="gurobi")


def test_no_schedule_in_time_starts_nothing_and_the_scheduler_runs_fcfs(monkeypatch, caplog):
    """A solver that finds nothing within its limit (a loaded machine: CI saw it at 0.5 s) is
    a decision that starts nothing, logged, not an error: the scheduler's liveness and
    work-conservation rules start, FCFS, what fits. Before, the whole run raised."""

    def nothing_in_time(*args, **kwargs):
        raise NoSchedule("CP-SAT found no schedule within 0.5 s (UNKNOWN); raise the time limit")

    monkeypatch.setattr(exact_allocator, "solve_model", nothing_in_time)
    view = ClusterView({"gpu": ChunkPool("gpu", {"g0": ChunkTree(4, "g0")})})
    queue = [Action("A", {"gpu": 2}, duration=1.0)]
    assert get_allocator("cpsat").allocate(view, queue, now=0.0) == []
    assert "falls back to FCFS" in caplog.text
    sched = Scheduler({"gpu": ChunkPool("gpu", {"g0": ChunkTree(4, "g0")})}, get_allocator("cpsat"))
    for a in [Action("A", {"gpu": 2}, duration=1.0), Action("B", {"gpu": 2}, duration=1.0)]:
        sched.submit(a)
    started = sched.decide(0.0)
    assert {s.action.id for s in started} == {"A", "B"}
