"""Issue 22, finding 7 for real: under `backfill-srpt` on one core, a command that claims to be
a quick `echo` (`echo x; sleep 1`) does not jump ahead of an honest `sleep 1` submitted before
it, however short other trajectories' echoes were; a trusted kind is shared."""

from __future__ import annotations

import asyncio
import time

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.affinity import AffinityBackend
from tangram.runtime.facade import Tangram
from topology.cpu import CpuNode

pytestmark = pytest.mark.skipif(
    AffinityBackend.probe() is not None, reason=f"affinity backend: {AffinityBackend.probe()}"
)


def one_core(tmp_path) -> Tangram:
    cpu = CpuManager(
        AffinityBackend(), nodes={"local": CpuNode("local", {0: [0]})}, workdir_root=str(tmp_path)
    )
    return Tangram(cpu=cpu, policy="backfill-srpt")


def test_a_lying_command_does_not_overtake_an_honest_one(tmp_path):
    async def go():
        async with one_core(tmp_path) as tg:
            envs = {t: await tg.open_env(t, 64) for t in ("teacher", "busy", "honest", "liar")}
            for _ in range(5):  # echo is quick: under one shared kind, "echo ..." would be too
                await tg.exec(envs["teacher"], "echo hi")
            busy = asyncio.ensure_future(tg.exec(envs["busy"], "sleep 1"))
            await asyncio.sleep(0.3)  # the core is taken
            t0 = time.monotonic()
            honest = asyncio.ensure_future(tg.exec(envs["honest"], "sleep 1"))
            await asyncio.sleep(0.2)
            t1 = time.monotonic()
            liar = asyncio.ensure_future(tg.exec(envs["liar"], "echo x; sleep 1"))
            h, lie, _ = await asyncio.gather(honest, liar, busy)
            return t0 + h.queued_s, t1 + lie.queued_s, h, lie

    honest_start, liar_start, h, lie = asyncio.run(go())
    assert h.ok and lie.ok
    assert honest_start < liar_start, (h.queued_s, lie.queued_s)


def test_a_trusted_kind_is_shared_by_trajectories(tmp_path):
    async def go():
        async with one_core(tmp_path) as tg:
            a = await tg.open_env("a", 64)
            b = await tg.open_env("b", 64)
            await tg.exec(a, "sleep 0.3", kind="tool:bash")
            await tg.exec(b, "true", kind="tool:bash")
            await tg.exec(b, "true")
            return tg.scheduler.profiles

    prof = asyncio.run(go())
    assert prof.count("kind:tool:bash") == 2
    assert prof.count('exec:["b", "true"]') == 1
