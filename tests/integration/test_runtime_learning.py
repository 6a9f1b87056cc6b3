"""The runtime learns an action's own run time, not the restore its service needed first: the
rule the simulator's engine applies (`evaluation.engine`, `Scheduler.complete(run_s=...)`
without the manager's restore), so their estimates, and then their grants, stay the same.
Found by `--engine runtime` on MOPD at batch 512 (`tests/integration/test_experiments.py`):
the facade had learned restore + inference, and two actions' GPU counts were swapped."""

from __future__ import annotations

import asyncio

import pytest

from evaluation import vclock
from managers.gpu import GB, GpuManager, Residency, Service, ServiceRegistry
from managers.gpu.sim import SimGpuBackend
from tangram.pools import ChunkPool
from tangram.runtime.facade import Tangram
from topology import ChunkTree

INFER_S, RESTORE_S = 0.5, 3.0


async def _two_calls() -> tuple[list[float], float | None]:
    reg = ServiceRegistry(
        {"A": Service.uniform("A", 60 * GB, restore_s=RESTORE_S, infer_s=INFER_S)}
    )
    res = Residency.uniform({"g0": 1}, 80 * GB, reg)
    loop = asyncio.get_running_loop()
    gpu = GpuManager(
        ChunkPool("gpu", {"g0": ChunkTree(1, "g0")}), res, SimGpuBackend(), clock=loop.time
    )
    async with Tangram(gpu=gpu, clock=loop.time) as tg:
        runs = [(await tg.invoke("A", {"n": i}, kind="lp")).run_s for i in range(2)]
        return runs, tg.scheduler.profiles.mean("lp")


def test_a_restore_is_not_learned_as_run_time():
    runs, learned = vclock.run(_two_calls())
    assert runs == pytest.approx([RESTORE_S + INFER_S, INFER_S])  # restored once, then resident
    assert learned == pytest.approx(INFER_S)
