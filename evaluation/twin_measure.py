"""The digital twin's measuring half (`evaluation.twin`): calibration (`calibrate`, giving a
`Profile`) and the real run through `Tangram.local()`, every action traced (`measure`, giving
`Observed` with its `Done`s)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evaluation.twin_plan import TIMEOUT_S, TwinParams, TwinTrajectory, reward_command, twin_kind
from managers.cpu.request import Command
from tangram.pools import CorePool
from tangram.runtime.facade import Tangram
from topology import CpuNode


@dataclass(frozen=True)
class Profile:
    """What calibration measured: run seconds per (command, cores), environment start seconds,
    and this machine's cores (one node, as `Tangram.local()` sees it). Each figure is the
    median of its samples."""

    samples: Mapping[tuple[Command, int], list[float]]
    opens: list[float]
    node: CpuNode
    dops: tuple[int, ...]

    @property
    def run_s(self) -> dict[tuple[Command, int], float]:
        return {k: statistics.median(v) for k, v in self.samples.items()}

    @property
    def open_s(self) -> float:
        return statistics.median(self.opens)


async def calibrate(p: TwinParams, trajs: Sequence[TwinTrajectory]) -> Profile:
    """Each command timed with the machine full of it: `cores // m` copies at m cores each at
    once (the run keeps the cores mostly busy, and a command alone on an idle machine runs
    faster than beside others: shared caches, memory bandwidth, the load of other tenants)."""
    commands = sorted({s.command for t in trajs for s in t.steps if not s.elastic}, key=str)
    reward = reward_command(p)
    async with Tangram.local() as tg:
        pool = tg.scheduler.pools[tg.cpu.resource]
        assert isinstance(pool, CorePool)
        name = pool.nodes()[0]
        node = pool.cpu_node(name).copy()
        cores = pool.capacity(name)
        dops = tuple(range(1, min(p.max_dop, cores) + 1))
        opens: list[float] = []
        runs: dict[tuple[Command, int], list[float]] = {}

        async def opened(i: int) -> str:
            t0 = time.monotonic()
            env = await tg.open_env(f"calibrate{i}")
            opens.append(time.monotonic() - t0)
            return env

        envs = [await opened(i) for i in range(cores)]
        for _ in range(p.reps):
            for cmd, m in [*((c, 1) for c in commands), *((reward, m) for m in dops)]:
                got = await asyncio.gather(
                    *(tg.exec(env, cmd, cpu=m, timeout=TIMEOUT_S) for env in envs[: cores // m])
                )
                runs.setdefault((cmd, m), []).extend(r.run_s for r in got)
        for env in envs:
            await tg.close_env(env)
    return Profile(runs, opens, node, dops)


@dataclass(frozen=True)
class Done:
    """One action of the real run: what it ran, with what, and when (seconds from the batch's
    start). `gap`: from the trajectory's previous result (its environment's opening, for the
    first) to this submission: the LLM gap as the client really waited it."""

    command: Command
    elastic: bool
    cores: int
    submitted: float
    gap: float
    queued_s: float
    run_s: float


@dataclass(frozen=True)
class Observed:
    acts: list[float]  # ACT (queued + run) of every action
    runs: list[float]  # run time (start to end) of every action
    busy: float  # granted core-seconds
    step_s: float  # batch start to the last action's end
    cores: int
    trace: Mapping[str, tuple[float, tuple[Done, ...]]] | None = None  # real run: per trajectory
    # its start (the opening of its environment) and its actions


async def measure(
    p: TwinParams, trajs: Sequence[TwinTrajectory], dops: tuple[int, ...]
) -> Observed:
    """The workload for real through `Tangram.local()`, every action traced (`Done`)."""
    trace: dict[str, tuple[float, tuple[Done, ...]]] = {}
    async with Tangram.local() as tg:
        cores = tg.scheduler.pools[tg.cpu.resource].capacity()
        t0 = time.monotonic()

        async def trajectory(t: TwinTrajectory) -> None:
            await asyncio.sleep(max(0.0, t0 + t.start - time.monotonic()))
            start = time.monotonic() - t0
            env = await tg.open_env(t.id)
            done, last = [], start
            for s in t.steps:
                await asyncio.sleep(s.think_s)
                cpu = (dops[0], dops[-1]) if s.elastic and len(dops) > 1 else 1
                submitted = time.monotonic() - t0
                r = await tg.exec(
                    env,
                    s.command,
                    cpu=cpu,
                    elastic=s.elastic,
                    timeout=TIMEOUT_S,
                    kind=twin_kind(s.command),
                )
                done.append(
                    Done(
                        s.command,
                        s.elastic,
                        r.units.get(tg.cpu.resource, 0),
                        submitted,
                        submitted - last,
                        r.queued_s,
                        r.run_s,
                    )
                )
                last = submitted + r.queued_s + r.run_s  # its end, as the runtime timed it
            trace[t.id] = (start, tuple(done))
            await tg.close_env(env)

        await asyncio.gather(*(trajectory(t) for t in trajs))
    ds = [d for _, dd in trace.values() for d in dd]
    return Observed(
        [d.queued_s + d.run_s for d in ds],
        [d.run_s for d in ds],
        sum(d.cores * d.run_s for d in ds),
        max(d.submitted + d.queued_s + d.run_s for d in ds),
        cores,
        trace,
    )
