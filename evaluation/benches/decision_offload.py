"""`tangram bench decisions`: what one client waits while a slow policy decides for others.

`--envs` trajectories each submit one elastic exec (sim backend) to a runtime on the CP-SAT
policy (`--time-limit` s, one worker); meanwhile a client asks `/v1/status` every 0.1 s (in
process, through the app). Its wait beyond the 0.1 s, with the decisions off the event loop
(the runtime's way for a `SlowPolicy`) and, as the same-run reference, with them inline. Also
the heuristic's mean inline decision CPU time on a closed loop, which keeps it inline.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app
from topology import CpuNode


class _Timed:
    """The policy, with the wall time of each decision recorded."""

    def __init__(self, inner) -> None:
        self.inner, self.took = inner, []

    def allocate(self, view, queue, now):
        t0 = time.perf_counter()
        try:
            return self.inner.allocate(view, queue, now)
        finally:
            self.took.append(time.perf_counter() - t0)


def _tangram(policy: str, **options) -> Tangram:
    cpu = CpuManager(
        SimCpuBackend(), nodes={"n0": CpuNode("n0", {0: tuple(range(8))})}, memory_mb={"n0": 65536}
    )
    return Tangram(cpu=cpu, policy=policy, policy_options=options)


async def _heuristic() -> str:
    tg = _tangram("heuristic")
    async with tg:
        envs = [await tg.open_env(f"t{i}", memory_mb=64) for i in range(20)]
        await asyncio.gather(
            *(tg.exec(e, "true", cpu=(1, 4), elastic=True) for e in envs for _ in range(10))
        )
    d = tg._decisions
    return (
        f"heuristic: {d.inline} inline decisions, mean CPU {d.mean_inline_s * 1e3:.2f} ms, "
        f"{d.offloaded} off the loop"
    )


async def _status_waits(offload: bool, envs: int, time_limit: float) -> str:
    tg = _tangram("cpsat", time_limit=time_limit, workers=1)
    if not offload:  # the reference: decisions inline, as before
        tg._decisions.can_offload = tg._decisions.slow = False
    timed = tg.scheduler.allocator = _Timed(tg.scheduler.allocator)
    async with tg:
        ids = [await tg.open_env(f"t{i}", memory_mb=64) for i in range(envs)]
        transport = httpx.ASGITransport(create_app(tg))
        async with httpx.AsyncClient(transport=transport, base_url="http://tangram") as http:
            runs = [asyncio.create_task(tg.exec(e, "true", cpu=(1, 4), elastic=True)) for e in ids]
            waits = []
            for _ in range(8):
                t0 = time.perf_counter()
                await asyncio.sleep(0.1)
                await http.get("/v1/status")
                waits.append(time.perf_counter() - t0 - 0.1)
            await asyncio.gather(*runs)
    return (
        f"cpsat, decisions {'off the loop' if offload else 'inline (reference)'}: "
        f"/v1/status wait max {max(waits) * 1e3:.0f} ms, median "
        f"{statistics.median(waits) * 1e3:.0f} ms; {len(timed.took)} decisions, longest "
        f"{max(timed.took) * 1e3:.0f} ms"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tangram bench decisions", description=__doc__)
    parser.add_argument("--envs", type=int, default=6)
    parser.add_argument("--time-limit", type=float, default=2.0)
    ns = parser.parse_args(argv)
    print(asyncio.run(_heuristic()))
    for offload in (True, False):
        print(asyncio.run(_status_waits(offload, ns.envs, ns.time_limit)))
    return 0
