"""A CPU workload run through the runtime itself: `Tangram` with the `sim` CPU backend on a
virtual-time loop (`evaluation.vclock`), the strongest form of "the simulator is production on
a virtual clock": the facade, the CPU manager (its environments and their node choice), the
scheduler and the policy are production code; only the clock and the backend are simulated.

Each trajectory opens its environment when it begins (`open_env`, the runtime's node rule),
waits each step's LLM generation gap, and `exec`s its action: a fixed action at its demand, an
elastic one at its range with `elastic=True`, so the runtime builds the estimate it builds for
any command. The sim backend plays the action's sampled duration with the granted cores. The
command is `<kind> <action id>`, so kinds are learned apart as the workload names them.

It answers what `evaluation.closedloop.run` answers for the same workload (records per action,
spans), so an experiment can run on either engine; `tests/property/
test_runtime_matches_simulator.py` checks that both grant the same on one node. Only CPU
workloads (no GPU services, no APIs): their sim backends would run the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from evaluation import vclock
from evaluation.closedloop import LoopResult
from evaluation.engine import ActionRecord, modelled_duration
from evaluation.workloads.base import Trajectory, Workload
from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimBackend
from tangram.actions import Action
from tangram.errors import ValidationError
from tangram.pools import CorePool
from tangram.runtime.facade import Tangram

MEMORY_MB = 16  # per environment; nodes get room for every trajectory (memory never binds)


def run_on_runtime(workload: Workload, policy: str, open_s: float = 0.0,
                   policy_options: Mapping[str, Any] | None = None) -> LoopResult:
    """`workload` through `Tangram(policy=policy, policy_options=...)` on virtual time;
    `open_s`: environment start."""
    return vclock.run(_run(workload, policy, open_s, dict(policy_options or {})))


def runs_on_runtime(workload: Workload) -> bool:
    """Whether `run_on_runtime` takes `workload`: CPU only, one core pool named cpu."""
    pools = workload.make_pools()
    return set(pools) == {"cpu"} and isinstance(pools["cpu"], CorePool)


async def _run(workload: Workload, policy: str, open_s: float,
               policy_options: dict[str, Any]) -> LoopResult:
    pools = workload.make_pools()
    if not runs_on_runtime(workload):
        raise ValidationError("workload.pools", sorted(pools), "the runtime engine runs CPU "
                              "workloads (one core pool named cpu)")
    pool = pools["cpu"]
    truth: dict[str, Action] = {s.action.id: s.action for t in workload.trajectories
                                for s in t.steps}

    def duration(command, cores: int) -> float:
        return modelled_duration(truth[command.split()[1]], {"cpu": cores})

    nodes = {n: pool.cpu_node(n) for n in pool.nodes()}
    mem = MEMORY_MB * max(1, len(workload.trajectories))
    cpu = CpuManager(SimBackend(duration, time_scale=1.0), nodes=nodes,
                     memory_mb={n: mem for n in nodes})
    loop = asyncio.get_running_loop()
    tg = Tangram(cpu=cpu, policy=policy, policy_options=policy_options, clock=loop.time)
    await tg.start()
    t0 = loop.time()
    records: dict[str, ActionRecord] = {}
    kinds: dict[str, tuple[str, str, str]] = {}
    setups: dict[str, tuple[float, float]] = {}
    spans: dict[str, tuple[float, float]] = {}

    async def trajectory(t: Trajectory) -> None:
        await asyncio.sleep(t.start)
        env = await tg.open_env(t.id, MEMORY_MB)
        await asyncio.sleep(open_s)
        setups[t.id] = (t.start, loop.time() - t0)
        for s in t.steps:
            await asyncio.sleep(s.think_s)
            a = s.action
            submitted = loop.time() - t0
            r = await tg.exec(env, f"{a.kind} {a.id}", cpu=a.demands["cpu"],
                              elastic=a.is_elastic, timeout=a.timeout or 1e9,
                              kind=a.kind)
            start = submitted + r.queued_s
            records[a.id] = ActionRecord(submitted, start, start + r.run_s, dict(r.units),
                                         None, r.status)
            kinds[a.id] = (t.id, a.task or "", a.kind)
        spans[t.id] = (t.start, loop.time() - t0)
        await tg.close_env(env)

    await asyncio.gather(*(trajectory(t) for t in workload.trajectories))
    counters: Mapping[str, float] = {"decisions": float(tg.scheduler.decisions),
                                     "actions": float(len(records))}
    await tg.shutdown()
    return LoopResult(records, kinds, setups, spans, dict(counters))
