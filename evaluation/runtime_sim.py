"""A workload run through the runtime itself: `Tangram` with `sim` backends on a virtual-time
loop (`evaluation.vclock`), the strongest form of "the simulator is production on a virtual
clock": the facade, the action builders (`managers/*/actions.py`), the CPU manager (its
environments and their node choice), the GPU manager (its residency cache, evictions and
restores), the scheduler and the policy are production code; only the clock and the
backends are simulated.

Each trajectory opens its environment when it begins (`open_env`, the runtime's node rule),
waits each step's LLM generation gap, and submits its action: a CPU action is `exec`ed at its
demand (an elastic one at its range with `elastic=True`), a GPU action `invoke`s its service
over its DoP variants, so the runtime builds the estimate it builds for any call. The sim
backends play the action's sampled duration with the granted units (`TruthGpuBackend`: the
GPU `sim` backend's restores, the action's own inference time). The command (the payload of
a GPU call) names the action, and the workload's kind is passed as the trusted kind, so kinds
are learned as the workload names them.

It answers what `evaluation.closedloop.run` answers for the same workload (records per action,
spans), so an experiment can run on either engine; `tests/property/
test_runtime_matches_simulator.py` checks that both grant the same. Not yet API pools: the
simulated API server (`evaluation.upstream`, its limits and 429s) is an engine executor with
no manager behind the facade.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from evaluation import vclock
from evaluation.closedloop import LoopResult, api_executors
from evaluation.engine import modelled_duration
from evaluation.upstream import ApiUpstream
from evaluation.workloads.base import Trajectory, Workload
from managers.basic import BasicManager, Limits
from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from managers.gpu import GpuManager, Service
from managers.gpu.backend import Chunk
from managers.gpu.sim import SimGpuBackend, SimServiceModel
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import ChunkPool, CorePool
from tangram.results import Result, ScheduledAction, Status
from tangram.runtime.facade import Tangram

MEMORY_MB = 16  # per environment; nodes get room for every trajectory (memory never binds)


class TruthGpuBackend(SimGpuBackend):
    """The `sim` GPU backend (restores take the service's restore time), whose invokes take
    the action's own modelled duration on the chunk's GPUs: the payload is the action id."""

    def __init__(self, truth: Mapping[str, Action], resource: str) -> None:
        super().__init__()
        self.truth = truth
        self.resource = resource

    async def invoke(self, service: Service, node: str, chunk: Chunk, payload: Any) -> Any:
        if (service.name, node, chunk) not in self.resident:
            raise RuntimeError(f"sim: {service.name} is not resident on {node}{chunk}")
        await asyncio.sleep(
            modelled_duration(self.truth[payload], {self.resource: chunk[1] - chunk[0]})
        )
        return None


def sim_api_manager(
    workload: Workload, pools: Mapping[str, Any], truth: Mapping[str, Action], clock
) -> tuple[BasicManager, ApiUpstream] | None:
    """The workload's API pools behind one basic manager (a concurrency gate per pool, as
    many slots as the pool has) whose calls take the action's modelled time plus what the
    simulated API server (`evaluation.upstream`, the engine's own model) adds: a 429 and its
    Retry-After for a call over the server's limit."""
    apis = {r: p for r, p in pools.items() if r.startswith("api:")}
    if not apis:
        return None
    ups = api_executors(workload)
    up = next(iter(ups.values())) if ups else ApiUpstream({})

    async def execute(a: Assignment) -> None:
        extra, _ = up.begin(a, clock())
        try:
            await asyncio.sleep(modelled_duration(truth[a.action.payload.json], a.units) + extra)
        finally:
            up.end(a, clock())

    limits = {r: Limits(concurrency=p.capacity()) for r, p in apis.items()}
    return BasicManager(limits, execute, clock=clock), up


def run_on_runtime(
    workload: Workload,
    policy: str,
    open_s: float = 0.0,
    policy_options: Mapping[str, Any] | None = None,
) -> LoopResult:
    """`workload` through `Tangram(policy=policy, policy_options=...)` on virtual time;
    `open_s`: environment start."""
    return vclock.run(_run(workload, policy, open_s, dict(policy_options or {})))


def runs_on_runtime(workload: Workload) -> bool:
    """Whether `run_on_runtime` takes `workload`: a core pool named cpu, with services
    declared the GPU chunk pool they run on, and API pools (`api:<name>`); nothing else."""
    pools = workload.make_pools()
    gpu = workload.gpu.name if workload.gpu is not None and workload.gpu.services else None
    return (
        all(r in ("cpu", gpu) or r.startswith("api:") for r in pools)
        and bool(pools)
        and isinstance(pools.get("cpu", CorePool("cpu", {})), CorePool)
        and (gpu is None or isinstance(pools.get(gpu), ChunkPool))
    )


def _managers(
    workload: Workload, truth: Mapping[str, Action], loop: asyncio.AbstractEventLoop
) -> dict[str, Any]:
    pools = workload.make_pools()
    out: dict[str, Any] = {}
    if "cpu" in pools:
        pool = pools["cpu"]
        assert isinstance(pool, CorePool)

        def duration(command, cores: int) -> float:
            return modelled_duration(truth[command.split()[1]], {"cpu": cores})

        nodes = {n: pool.cpu_node(n) for n in pool.nodes()}
        mem = MEMORY_MB * max(1, len(workload.trajectories))
        out["cpu"] = CpuManager(
            SimCpuBackend(duration, time_scale=1.0), nodes=nodes, memory_mb={n: mem for n in nodes}
        )
    if workload.gpu is not None and workload.gpu.name in pools:
        r = workload.gpu.name
        residency = SimServiceModel(workload.gpu).residency  # the simulator's own sizing
        pool = pools[r]
        assert isinstance(pool, ChunkPool)
        out["gpu"] = GpuManager(pool, residency, TruthGpuBackend(truth, r), clock=loop.time)
    api = sim_api_manager(workload, pools, truth, loop.time)
    if api is not None:
        out["apis"] = {r[len("api:") :]: api[0] for r in api[0].pools()}
        out["upstream"] = api[1]
    return out


async def _submit(tg: Tangram, env: str | None, a: Action) -> Result:
    api = next((r for r in a.demands if r.startswith("api:")), None)
    if api is not None:
        return await tg.call_api(api[len("api:") :], a.id, kind=a.kind)
    if a.service is not None:
        d = a.demands[tg.gpu.resource]
        return await tg.invoke(a.service, a.id, gpus=list(d.amounts), kind=a.kind)
    assert env is not None
    return await tg.exec(
        env,
        f"{a.kind} {a.id}",
        cpu=a.demands["cpu"],
        elastic=a.is_elastic,
        timeout=a.timeout or 1e9,
        kind=a.kind,
    )


def _timed_decisions(tg: Tangram) -> dict[str, float]:
    """The engine's counters, to fill as the run goes; the scheduler's decisions timed in
    wall and CPU seconds as the engine times them (the same `Scheduler.decide`, wrapped)."""
    counters = dict.fromkeys(
        ("restores", "overhead_s", "timeouts", "decide_wall_s", "decide_cpu_s"), 0.0
    )
    decide = tg.scheduler.decide

    def timed(now: float):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return decide(now)
        finally:
            counters["decide_wall_s"] += time.perf_counter() - t0
            counters["decide_cpu_s"] += time.thread_time() - c0

    tg.scheduler.decide = timed  # type: ignore[method-assign]
    return counters


def _record(action: Action, submitted: float, r: Result) -> ScheduledAction:
    """What the runtime measured of one action submitted at `submitted`, as the engine records
    it (restored: whether a GPU service call restored its service first)."""
    start = submitted + r.queued_s
    restored = r.restore_s > 0 if action.service is not None else None
    units, placement = dict(r.units), dict(r.placement)
    return ScheduledAction(
        action, submitted, start, start + r.run_s, units, placement, r.status, restored
    )


async def _run(
    workload: Workload, policy: str, open_s: float, policy_options: dict[str, Any]
) -> LoopResult:
    if not runs_on_runtime(workload):
        raise ValidationError(
            "workload.pools",
            sorted(workload.make_pools()),
            "the runtime "
            "engine runs a core pool named cpu, the GPU chunk pool of the "
            "declared services and api:<name> pools, nothing else",
        )
    truth: dict[str, Action] = {
        s.action.id: s.action for t in workload.trajectories for s in t.steps
    }
    loop = asyncio.get_running_loop()
    managers = _managers(workload, truth, loop)
    up = managers.pop("upstream", None)
    tg = Tangram(**managers, policy=policy, policy_options=policy_options, clock=loop.time)
    await tg.start()
    t0 = loop.time()
    out = LoopResult({}, {}, {}, {}, {})
    counters = _timed_decisions(tg)

    async def trajectory(t: Trajectory) -> None:
        await asyncio.sleep(t.start)
        env = None if tg.cpu is None else await tg.open_env(t.id, MEMORY_MB)
        await asyncio.sleep(open_s)
        out.setups[t.id] = (t.start, loop.time() - t0)
        for s in t.steps:
            await asyncio.sleep(s.think_s)
            submitted = loop.time() - t0
            r = await _submit(tg, env, s.action)
            rec = out.records[s.action.id] = _record(s.action, submitted, r)
            counters["restores"] += bool(rec.restored)
            counters["overhead_s"] += r.restore_s
            counters["timeouts"] += r.status is Status.TIMEOUT
            out.kinds[s.action.id] = (t.id, s.action.task or "", s.action.kind)
        out.spans[t.id] = (t.start, loop.time() - t0)
        if env is not None:
            await tg.close_env(env)

    await asyncio.gather(*(trajectory(t) for t in workload.trajectories))
    out.counters.update(
        counters, decisions=float(tg.scheduler.decisions), actions=float(len(out.records))
    )
    if up is not None:  # as the engine counts them (`ClosedLoopSimulator.run`)
        half = max((e for _, e in out.spans.values()), default=0.0) / 2
        out.counters["api_429"] = float(up.total)
        out.counters["api_429_late"] = float(sum(t > half for t in up.refused_at))
    await tg.shutdown()
    return out
