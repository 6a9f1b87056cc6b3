"""The runtime grants elastic execs by the E(m) it fitted for their kind, not by the prior.

A command that gets slower with more cores (worker start-up beating the gain, as the measured
more-itertools run): the first elastic exec follows the prior (serial fraction 0.25: the most
cores are fastest) and runs slowly; after a few runs the kind's fit has learned the curve and
the next elastic exec of the kind gets one core. Replacing the fit by the prior in
`Tangram.exec` fails this test."""

import asyncio

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.profiles import exec_kind
from tangram.runtime.facade import Tangram
from topology import CpuNode


def slower_with_cores(command, cores: int) -> float:
    return 0.05 * cores  # 1 core 0.05 s, 4 cores 0.2 s (wall clock, time_scale 1)


def test_elastic_exec_follows_the_fitted_curve_not_the_prior():
    async def main():
        cpu = CpuManager(
            SimCpuBackend(slower_with_cores, time_scale=1.0),
            nodes={"n0": CpuNode("n0", {0: (0, 1, 2, 3)})},
            memory_mb={"n0": 4096},
        )
        async with Tangram(cpu=cpu, policy="heuristic") as tg:
            env = await tg.open_env("t0", 64)
            first = await tg.exec(env, "tool run", cpu=(1, 4), elastic=True)
            assert first.ok and first.units == {"cpu": 4}  # the prior: more cores, faster
            for _ in range(3):  # fixed runs of the kind refine its fit too
                assert (await tg.exec(env, "tool run", cpu=1)).ok
            fit = tg.scheduler.profiles.speedup(exec_kind("t0", "tool run"), 0.25, 1.0)
            assert fit.predict(1) < fit.predict(4)
            learned = await tg.exec(env, "tool run", cpu=(1, 4), elastic=True)
            assert learned.ok and learned.units == {"cpu": 1}, learned.units

    asyncio.run(main())
