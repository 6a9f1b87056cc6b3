"""The simulator's service model, the sim backend, and the GPU manager run through it."""

from __future__ import annotations

import asyncio

import pytest

from managers.gpu import (
    GB,
    GpuBackend,
    GpuManager,
    Residency,
    Service,
    ServiceRegistry,
    create_backend,
)
from managers.gpu.sim import SimGpuBackend, SimServiceModel
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.instance import parse_instance
from tangram.pools import ChunkPool, Placement
from topology import ChunkTree

DOC = {
    "resources": {
        "cpu": {"topology": "flat", "units": 4},
        "gpu": {
            "topology": "chunks",
            "nodes": 1,
            "gpus_per_node": 2,
            "memory_gb": 80,
            "services": {
                "A": {"memory_gb": 60, "restore_s": 2.0},
                "B": {"memory_gb": 60, "restore_s": 3.0},
            },
        },
    },
    "actions": [
        {"id": "a", "demand": {"gpu": 1}, "duration": 1, "service": "A"},
        {"id": "c", "demand": {"cpu": 1}, "duration": 1},
    ],
}


def assign(action: Action, node: str, chunk) -> Assignment:
    k = chunk[1] - chunk[0]
    return Assignment(action, {"gpu": k}, {"gpu": Placement(node, chunk=chunk)})


def test_sim_service_model_adds_restore_time_once() -> None:
    inst = parse_instance(DOC)
    model = SimServiceModel(inst.resources["gpu"])
    a = inst.actions[0]
    asg = assign(a, "gpu0", (0, 1))
    assert model.begin(asg, 0.0) == (2.0, True)
    model.end(asg, 3.0)
    assert model.begin(asg, 5.0) == (0.0, False)
    model.end(asg, 6.0)
    cpu = inst.actions[1]
    assert model.begin(Assignment(cpu, {"cpu": 1}, {"cpu": Placement("node0")}), 0) == (0.0, False)


def test_sim_service_model_needs_a_chunk_pool() -> None:
    inst = parse_instance(DOC)
    with pytest.raises(ValidationError, match="topology"):
        SimServiceModel(inst.resources["cpu"])


def manager(backend: GpuBackend, gpus: int = 1) -> GpuManager:
    reg = ServiceRegistry(
        {
            "A": Service.uniform("A", 60 * GB, infer_s=0.5),
            "B": Service.uniform("B", 60 * GB, infer_s=0.5),
        }
    )
    res = Residency.uniform({"g0": gpus}, 80 * GB, reg)
    return GpuManager(
        ChunkPool("gpu", {"g0": ChunkTree(gpus, "g0")}),
        res,
        backend,
        clock=iter(range(1000)).__next__,
    )


def test_manager_restores_evicts_and_invokes_through_the_backend() -> None:
    backend = create_backend("sim", time_scale=0.0)
    assert isinstance(backend, SimGpuBackend)
    m = manager(backend)

    async def go():
        outs = []
        for i, s in enumerate("AAB"):
            a = Action(f"x{i}", {"gpu": 1}, duration=1.0, service=s, payload={"q": i})
            outs.append(await m.run(assign(a, "g0", (0, 1))))
        await m.close()
        return outs

    outs = asyncio.run(go())
    assert [o.status for o in outs] == ["ok"] * 3
    assert [o.restore_s > 0 for o in outs] == [True, False, True]
    assert outs[1].output["request"] == {"q": 1}
    assert [c[0] for c in backend.calls] == [
        "restore",
        "invoke",
        "invoke",
        "evict",
        "restore",
        "invoke",
    ]
    assert backend.deployed == {"A", "B"}
    assert backend.resident == {("B", "g0", (0, 1))}


class FailingRestore(SimGpuBackend):
    async def restore(self, service, node, chunk):
        raise OSError("link down")


def test_a_failed_restore_is_an_outcome_and_leaves_nothing_resident() -> None:
    m = manager(FailingRestore(time_scale=0.0))
    a = Action("x", {"gpu": 1}, duration=1.0, service="A")
    out = asyncio.run(m.run(assign(a, "g0", (0, 1))))
    assert out.status == "failed" and "link down" in out.detail
    assert not m.residency.is_resident("A", "g0", (0, 1))
    assert m.residency.busy("g0", 0) is None


def test_an_action_without_a_service_fails_cleanly() -> None:
    m = manager(SimGpuBackend(time_scale=0.0))
    a = Action("x", {"gpu": 1}, duration=1.0)
    assert asyncio.run(m.run(assign(a, "g0", (0, 1)))).status == "failed"


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ValidationError, match="nope"):
        create_backend("nope")
