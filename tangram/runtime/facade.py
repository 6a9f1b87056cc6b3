"""The runtime: the scheduler on the wall clock, driving real managers, behind an asyncio API.

```python
async with Tangram.local() as tg:
    env = await tg.open_env("traj-1", memory_mb=1024)
    r = await tg.exec(env, "pytest -q tests", cpu=(1, 8), elastic=True, timeout=600)
    r = await tg.exec(env, "python train.py", cpu=2, gpus=1)  # cores and a GPU: one action
    out = await tg.invoke("judge", {"token_ids": [1, 2, 3]}, gpus=(1, 2))
    resp = await tg.call_api("search", {"q": "tangram"})
    await tg.close_env(env)
```

Every call becomes an *action* on the one queue; the policy runs on every arrival and
completion; the manager of the action's pool runs it with exactly the granted units. A vector
exec (`gpus=`) is one action over the CPU and GPU pools: the GPU manager evicts what is resident
on its chunk (`GpuManager.claim`), then the CPU manager runs the command with those GPUs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from managers.api import ApiManager, api_action
from managers.base import EnvironmentManager, Manager
from managers.cpu.actions import exec_action
from managers.cpu.environments import EnvRecord
from managers.gpu import GpuManager
from managers.gpu.actions import invoke_action
from solvers import get_allocator
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ActionFailed, NotFound, ShuttingDown, ValidationError
from tangram.results import Result, ScheduledAction, Status
from tangram.runtime.config import DEFAULT_POLICY, build, build_local, load_config
from tangram.runtime.decisions import Decisions
from tangram.runtime.entries import Pending
from tangram.runtime.environments import Environments
from tangram.runtime.kernels import Kernels
from tangram.runtime.metrics import Metrics
from tangram.runtime.ray import build_ray
from tangram.runtime.sessions import Sessions
from tangram.runtime.shards import ShardedScheduler
from tangram.runtime.status import NodeUnits, PoolStatus, StatusSnapshot
from tangram.scheduler import Scheduler
from tangram.scheduling import SchedulerInterface
from tangram.trace import write_trace

log = logging.getLogger("tangram")


class Tangram(Environments, Sessions, Kernels):
    """One scheduler, its managers and the environments of the trajectories it serves."""

    def __init__(
        self,
        *,
        cpu: EnvironmentManager | None = None,
        gpu: GpuManager | None = None,
        apis: Mapping[str, Manager] | None = None,
        policy: str = DEFAULT_POLICY,
        policy_options: Mapping[str, Any] | None = None,
        idle_env_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        shards: int = 0,
        trace: str | None = None,
    ) -> None:
        """`clock`: the time source of every timing and decision (a virtual-time loop's
        `loop.time` runs the runtime on the simulator's clock, `evaluation.vclock`).
        `trace`: a file the run's trace is written to at shutdown (Chrome's trace-event
        format, which Perfetto opens: `tangram.trace`): each action on the units it held.
        `shards` > 0: the scheduler split into that many node shards plus the global shard
        here (`tangram.runtime.shards`, docs/scale.md): each a process, or a Ray actor when
        this process is connected to Ray."""
        self.cpu = cpu
        self.gpu = gpu
        self.apis = dict(apis or {})
        pools = {}
        self._managers = list(
            {id(m): m for m in [cpu, gpu, *self.apis.values()] if m is not None}.values()
        )
        for m in self._managers:
            for r, p in m.pools().items():
                if r in pools:
                    raise ValidationError("pools", r, "two managers own the same resource")
                pools[r] = p
        make = functools.partial(ShardedScheduler, shards=shards) if shards else Scheduler
        allocator = get_allocator(policy, **dict(policy_options or {}))
        self.scheduler: SchedulerInterface = make(pools, allocator)
        if cpu is not None:  # one binding record, where the scheduler can read one
            self.scheduler.attach_bindings(cpu.resource, cpu.trajectory_nodes)
        self.policy = policy
        self.idle_env_s = idle_env_s
        self.metrics = Metrics(self.status)
        self._pending: dict[str, Pending] = {}
        self.adapters: dict[str, Any] = {}  # what an adapter keeps per facade (its warm pool)
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._closed = False
        self._clock = clock
        self._t0 = clock()
        self.trace_path = trace
        self.traced: list[ScheduledAction] = []  # every action that ran, where tracing
        self._reaper: asyncio.Task | None = None
        # a slow policy decides in a worker thread; never on a virtual clock (module docstring)
        self._decisions = Decisions(
            self.scheduler, self._now, self._started, offload=clock is time.monotonic
        )

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def local(cls, **options: Any) -> Tangram:
        """This machine: its cores with the best CPU backend, a simulated GPU pool when there
        is no GPU (saying so), no APIs unless given. See `tangram.runtime.config.build_local`."""
        trace = options.pop("trace", None)  # (the facade's own, not a component's)
        return cls(**build_local(**options).kwargs(), trace=trace)

    @classmethod
    def ray(cls, address: str | None = None, *, shards: int = 0, **options: Any) -> Tangram:
        """The same API over a Ray cluster: a node agent per machine enforces its cores, the
        scheduler here keeps the global state (`shards` > 0: split into node shards, each a Ray
        actor). See `tangram.runtime.ray.build_ray`."""
        trace = options.pop("trace", None)  # (the facade's own, not a component's)
        return cls(**{**build_ray(address, **options).kwargs(), "shards": shards}, trace=trace)

    @classmethod
    def from_config(cls, path: str) -> Tangram:
        """Build from a YAML file; a bad key fails here with its path."""
        return cls(**load_config(path).kwargs())

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Tangram:
        """Build from a config document already loaded (the YAML file's content)."""
        return cls(**build(doc).kwargs())

    async def start(self) -> Tangram:
        for m in self._managers:
            await m.start()
        if self.idle_env_s and self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_idle())
        log.info(
            "tangram: policy %s; pools %s",
            self.policy,
            ", ".join(f"{r} ({p.capacity()} units)" for r, p in self.scheduler.pools.items()),
        )
        return self

    async def __aenter__(self) -> Tangram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- actions -------------------------------------------------------------------------------
    async def exec(
        self,
        env: str,
        command: str | list[str],
        cpu: Any = 1,
        elastic: bool = False,
        timeout: float = 60.0,
        output_cap: int | None = None,
        kind: str | None = None,
        gpus: Any = None,
    ) -> Result:
        """`kind`: what the action is, from the trusted caller (an adapter's tool name), which
        keys the duration estimates every trajectory shares; without it, the estimates are the
        trajectory's own (`profiles.exec_kind`). `gpus` (an amount, a list of amounts or a
        (lo, hi) range, as `invoke` takes; None: no GPU): the command also gets one aligned
        chunk of the GPU pool on its environment's machine, in the same action (placed with
        the cores, atomically), named in its variables and, on bwrap, the only GPU devices in
        its sandbox (`managers.cpu.grant`). The action: `managers.cpu.actions`."""
        self._admitting()
        e = self._env(env)
        assert self.cpu is not None
        gpu_resource, gpu_node = (
            self._gpu_for(e.env.trajectory, gpus) if gpus is not None else (None, None)
        )
        action = exec_action(
            self.cpu.resource,
            env,
            e.env.trajectory,
            command,
            cpu,
            elastic=elastic,
            timeout=timeout,
            output_cap=output_cap,
            kind=kind,
            profiles=self.scheduler.profiles,
            now=self._now(),
            gpus=gpus,
            gpu_resource=gpu_resource,
            gpu_node=gpu_node,
        )
        return await self._submit_in(e, action, self.cpu, "exec")

    async def _submit_in(
        self, record: EnvRecord, action: Action, manager: Manager, metric_kind: str
    ) -> Result:
        """Submit an action of an environment's (an exec, a session's command): counted on its
        record while queued or running (a fork waits for none), its last use the end."""
        record.actions.add(action.id)
        try:
            return await self._submit(action, manager, metric_kind)
        finally:
            record.actions.discard(action.id)
            record.last_used = self._clock()

    def _gpu_for(self, trajectory: str, gpus: Any) -> tuple[str, str]:
        """The GPU pool and its node on the machine of `trajectory`'s environment, for a vector
        exec; a `ValidationError` naming `gpus` where there is none (no GPU manager, a backend
        that gives no GPUs, no GPU node matching the environment's)."""
        assert self.cpu is not None
        if self.gpu is None:
            raise ValidationError(
                "gpus", gpus, "no GPU pool is configured (no GPU manager): a command gets no GPUs"
            )
        refused = self.cpu.gpus_refused()
        if refused is not None:
            raise ValidationError("gpus", gpus, refused)
        if not self.scheduler.places_vector_actions:
            raise ValidationError(
                "gpus", gpus, "the sharded scheduler places no action over cores and GPUs together"
            )
        node = self.cpu.binding(trajectory)
        match = None if node is None else self.gpu.machine_of(node, self.cpu.pool.nodes())
        if match is None:
            raise ValidationError(
                "gpus",
                gpus,
                f"the environment's node {node} has no GPUs of the pool {self.gpu.resource!r} "
                f"(its nodes: {', '.join(self.gpu.pool.nodes()) or 'none'})",
            )
        if len(self.gpu.pool.nodes()) > 1:  # the chunk must come from the environment's node
            self.scheduler.bind(trajectory, self.gpu.resource, match)
        return self.gpu.resource, match

    async def invoke(
        self, service: str, payload: Any = None, gpus: Any = 1, kind: str | None = None
    ) -> Result:
        """One call of a registered GPU service; `kind` as for `exec` (default
        `invoke:<service>`). The action: `managers.gpu.actions`."""
        self._admitting()
        if self.gpu is None:
            raise NotFound("service", service, "no GPU pool is configured")
        action = invoke_action(
            self.gpu.residency.registry,
            self.gpu.resource,
            service,
            payload,
            gpus,
            self._now(),
            profiles=self.scheduler.profiles,
            kind=kind,
        )
        return await self._submit(action, self.gpu, f"invoke:{service}")

    async def call_api(self, name: str, payload: Any = None, kind: str | None = None) -> Result:
        """One call of a configured API; `kind` as for `exec` (default `api:<name>`). The
        action: `managers.api.api_action`."""
        self._admitting()
        manager = self.apis.get(name) if isinstance(name, str) else None
        if manager is None:
            raise NotFound("api", name, f"unknown API (configured: {sorted(self.apis)})")
        action = api_action(name, payload, self._now(), kind)
        return await self._submit(action, manager, f"api:{name}")

    # -- the loop ------------------------------------------------------------------------------
    def _now(self) -> float:
        return self._clock() - self._t0

    def _admitting(self) -> None:
        if self._closing:
            raise ShuttingDown("Tangram is shutting down: no new work is admitted")

    async def _submit(self, action: Action, manager: Manager, metric_kind: str) -> Result:
        self.scheduler.submit(action)  # validation: unknown resource, demand that never fits
        fut = asyncio.get_running_loop().create_future()
        self._pending[action.id] = Pending(
            action, manager, fut, self._clock(), metric_kind=metric_kind
        )
        self._kick()
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if self.scheduler.cancel(action.id):  # still queued: drop it, nothing ran
                self._pending.pop(action.id, None)
                log.info("action %s cancelled by its caller while queued", action.id)
                if not self._closed:
                    self._kick()  # it may have been the head others waited behind
            raise

    def _kick(self) -> None:
        """Run the policy now (or, for a slow one, off the loop) and start what it grants."""
        self._decisions.kick()

    def _started(self, granted: list[Assignment]) -> None:
        for aid, err in self.scheduler.take_failed():  # never started: a lost shard's queue
            self._finish_cancelled(aid, str(err), Status.FAILED)
        for a in granted:
            p = self._pending[a.action.id]
            p.started = self._clock()
            task = asyncio.create_task(self._run(p, a))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.scheduler.queue and log.isEnabledFor(logging.DEBUG):
            head = next(iter(self.scheduler.queue.values()))
            log.debug(
                "%d waiting; first %s needs %s, free %s",
                len(self.scheduler.queue),
                head.id,
                dict(head.mins),
                {r: self.scheduler.pools[r].free() for r in head.mins},
            )

    async def _perform(self, p: Pending, a: Assignment) -> Result:
        """Run one granted action by its manager; a vector exec (the CPU manager's, holding a
        GPU chunk too) after the GPU manager has evicted what is resident on the chunk, which
        takes no restore until the command ends (`GpuManager.claim`, `release`)."""
        gpu = self.gpu
        if gpu is None or p.manager is gpu or gpu.resource not in a.placement:
            return await p.manager.run(a)
        refused = await gpu.claim(a)
        if refused is not None:
            return refused
        try:
            return await p.manager.run(a)
        finally:
            gpu.release(a)

    async def _run(self, p: Pending, a: Assignment) -> None:
        try:
            outcome = await self._perform(p, a)
        except asyncio.CancelledError:
            outcome = Result(Status.CANCELLED, detail="cancelled at shutdown while running")
        except Exception as exc:  # a manager bug must not take other actions down
            log.exception("action %s: manager %s raised", a.action.id, p.manager.name)
            outcome = Result(Status.FAILED, detail=f"{type(exc).__name__}: {exc}")
        end = self._clock()  # learned: its own run, not its restore; at 1 ns as the engine
        self.scheduler.complete(
            a.action.id,
            self._now(),
            run_s=round(max(0.0, end - p.started - outcome.restore_s), 9),
            status=outcome.status,
        )
        self._pending.pop(a.action.id, None)
        if self.trace_path is not None:
            self.traced.append(
                ScheduledAction(
                    a.action, p.submitted, p.started, end, a.units, a.placement, outcome.status
                )
            )
        result = outcome.granted(
            a.action.id, a.units, a.placement, p.started - p.submitted, end - p.started
        )
        self.metrics.observe(p.metric_kind, outcome.status, result.queued_s, result.act_s)
        if outcome.restore_s > 0 and a.action.service:
            self.metrics.restores.labels(a.action.service).inc()
        if not p.future.done():
            p.future.set_result(result)
        if not self._closed:
            self._kick()

    def _finish_cancelled(
        self, action_id: str, why: str, status: Status = Status.CANCELLED
    ) -> None:
        p = self._pending.pop(action_id, None)
        if p is not None and not p.future.done():
            p.future.set_result(
                Result(
                    status, detail=why, action_id=action_id, queued_s=self._clock() - p.submitted
                )
            )

    # -- observability -------------------------------------------------------------------------
    def status(self) -> StatusSnapshot:
        pools = {
            r: PoolStatus(
                p.capacity(), p.free(), {n: NodeUnits(p.capacity(n), p.free(n)) for n in p.nodes()}
            )
            for r, p in self.scheduler.pools.items()
        }
        throttled = {
            name: m.throttled(name) if isinstance(m, ApiManager) else 0
            for name, m in self.apis.items()
        }
        learned = {
            name: w.allowed(time.monotonic())
            for name, m in self.apis.items()
            if isinstance(m, ApiManager) and (w := m.window(name)) is not None
        }
        gpu = self.gpu
        return StatusSnapshot(
            self.policy,
            pools,
            len(self.scheduler.queue),
            len(self.scheduler.running),
            0 if self.cpu is None else len(self.cpu.envs.records()),
            None if self.cpu is None else self.cpu.backend_name,
            None if self.cpu is None else self.cpu.isolates,
            None if gpu is None else gpu.backend_name,
            None if gpu is None else gpu.simulated,
            None if gpu is None else gpu.origin,
            _lost(self.cpu),
            throttled,
            learned,
            self._closing,
        )

    # -- lifecycle -------------------------------------------------------------------------------
    async def shutdown(self, deadline: float = 10.0) -> None:
        """Stop admitting, cancel queued actions, let running ones finish within `deadline`
        seconds (then cancel them: their process trees are killed), close every environment
        and manager. Idempotent."""
        if self._closed:
            return
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
        for aid in list(self.scheduler.queue.keys()):
            self.scheduler.cancel(aid)
            self._finish_cancelled(aid, "Tangram shut down before it started")
        await self._decisions.close()
        if self._tasks:
            done, late = await asyncio.wait(set(self._tasks), timeout=deadline)
            for t in late:
                t.cancel()
            if late:
                log.warning(
                    "shutdown: %d actions still running after %.1f s were cancelled",
                    len(late),
                    deadline,
                )
                await asyncio.gather(*late, return_exceptions=True)
        self._closed = True
        if self.trace_path is not None:
            write_trace(self.traced, self.trace_path)
            log.warning("trace of %d actions written to %s", len(self.traced), self.trace_path)
        for env_id in [] if self.cpu is None else [r.id for r in self.cpu.envs.records()]:
            try:
                await self.close_env(env_id)
            except Exception:  # keep closing the rest
                log.exception("closing env %s", env_id)
        for m in self._managers:
            await m.close()
        self.scheduler.close()
        log.info("tangram: shut down")


def require_ok(result: Result) -> Result:
    """Raise `ActionFailed` unless the action succeeded (a convenience for scripts)."""
    if not result.ok:
        raise ActionFailed(f"action {result.action_id}: {result.status}: {result.detail}")
    return result


def _lost(cpu: object) -> str | None:
    """What the local CPU backend does not guarantee here (`Backend.guarantees_lost`)."""
    lost = getattr(getattr(cpu, "backend", None), "guarantees_lost", None)
    return lost if isinstance(lost, str) else None
