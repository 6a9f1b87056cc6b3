"""Where two implementations must agree, they agree: `Tangram` and `TangramClient` on
`tangram.runtime.api.TangramApi`, `Scheduler` and `ShardedScheduler` on
`tangram.scheduling.SchedulerInterface`, member by member, each method with the Protocol's
parameters (names, kinds and defaults), so neither side can drift from the other again."""

from __future__ import annotations

import inspect

import pytest

from solvers import get_allocator
from tangram.errors import InvariantError
from tangram.pools import CorePool
from tangram.runtime.api import TangramApi
from tangram.runtime.client import TangramClient
from tangram.runtime.decisions import Decisions
from tangram.runtime.facade import Tangram
from tangram.runtime.shards import ShardedScheduler
from tangram.scheduler import Scheduler
from tangram.scheduling import QueuedActions, SchedulerInterface
from topology import CpuNode


def members(protocol: type) -> set[str]:
    """The public members a Protocol declares: its methods, properties and attributes."""
    return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


def methods(protocol: type) -> set[str]:
    return {n for n in members(protocol) if inspect.isfunction(vars(protocol).get(n))}


def parameters(fn) -> list[tuple[str, inspect._ParameterKind, object]]:
    """(name, kind, default) of each parameter: what a caller's call depends on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", [Tangram, TangramClient])
@pytest.mark.parametrize("name", sorted(methods(TangramApi)))
def test_tangram_and_its_client_take_the_apis_parameters(cls, name):
    ours, theirs = getattr(TangramApi, name), getattr(cls, name)
    assert inspect.iscoroutinefunction(theirs), f"{cls.__name__}.{name} is not async"
    assert parameters(theirs) == parameters(ours), f"{cls.__name__}.{name}"


def test_the_api_holds_open_env_exec_and_close_env():
    assert {"open_env", "exec", "close_env"} <= methods(TangramApi)
    assert "output_cap" in inspect.signature(TangramClient.exec).parameters


def _scheduler(kind: str):
    """One of each kind over one core pool (the sharded one without its shard processes)."""
    pools = {"cpu": CorePool("cpu", {"n0": CpuNode("n0", {0: (0, 1)})})}
    if kind == "single":
        return Scheduler(pools, get_allocator("min"))
    return ShardedScheduler(pools, get_allocator("min"), shards=1, backend="process", start=False)


@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_both_schedulers_implement_the_scheduler_interface(kind):
    scheduler = _scheduler(kind)
    missing = sorted(n for n in members(SchedulerInterface) if not hasattr(scheduler, n))
    assert not missing, f"{kind} lacks {missing}"
    for name in sorted(methods(SchedulerInterface)):
        ours = parameters(getattr(SchedulerInterface, name))[1:]  # less `self`
        assert parameters(getattr(scheduler, name)) == ours, f"{kind}: {name}"
    assert isinstance(scheduler.places_vector_actions, bool)
    assert isinstance(scheduler.splits_decisions, bool)
    q = scheduler.queue
    assert all(hasattr(q, n) for n in members(QueuedActions) | {"__len__", "__contains__"})
    assert list(scheduler.take_failed()) == [] and len(q) == 0


def test_only_a_scheduler_that_splits_its_decisions_has_them_offloaded():
    single, sharded = _scheduler("single"), _scheduler("sharded")
    for s, split in ((single, True), (sharded, False)):
        assert Decisions(s, lambda: 0.0, lambda granted: None, offload=True).can_offload is split
        assert s.places_vector_actions is split  # the sharded one places no vector action
    with pytest.raises(InvariantError, match="inline only"):
        sharded.prepare(0.0)
