"""Commands in the CPU manager's environments: a scheduler's assignment (`run`) or one request
taken outside a scheduler (`execute`), and the disk limit named where a command filled it.

A mixin of `CpuManager` (its one job: the exec path); it needs the manager's table (each
environment's `EnvRecord`: its state, its running commands), pool and backend.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING

from managers.cpu.backends.base import Backend, EnvironmentBroken
from managers.cpu.environments import EnvironmentTable, EnvRecord, EnvState
from managers.cpu.layers import LayerStore
from managers.cpu.request import ExecRequest, exec_target, gpu_grant
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.pools import CorePool
from tangram.resources import Demand
from tangram.results import Result, Status


class EnvExecs:
    resource: str
    pool: CorePool
    envs: EnvironmentTable
    backend: Backend

    if TYPE_CHECKING:  # the manager's own (`shells.EnvShells`)

        async def run_in_session(
            self, record: EnvRecord, req: ExecRequest, cores: tuple[int, ...]
        ) -> Result: ...

    async def run(self, assignment: Assignment) -> Result:
        target = exec_target(assignment, self.envs)
        if isinstance(target, Result):
            return target
        req, env = target
        placement = assignment.placement.get(self.resource)
        if placement is None or not placement.cores or placement.node != env.node:
            return Result(
                Status.FAILED,
                detail=f"action {assignment.action_id}: placement "
                f"{placement} is not cores on the environment's node {env.node}",
            )
        gpus = gpu_grant(assignment, req, env.node)  # a vector exec's chunk (its host indices)
        if isinstance(gpus, Result):
            return gpus
        record = self.envs.record(env.id)
        assert record is not None
        await record.settled()  # a fork, snapshot or reset of it ends first
        if record.state is EnvState.BROKEN:
            return Result(Status.FAILED, detail=record.why)
        if record.state in (EnvState.CLOSING, EnvState.CLOSED, EnvState.OPENING):
            return Result(Status.CANCELLED, detail=f"environment {env.id} is {record.state.value}")
        record.command_started()
        full_before = self._disk_full(record)
        try:
            if req.session is not None:
                outcome = await self.run_in_session(record, req, placement.cores)
            else:
                outcome = await record.sandbox.exec(req.spec(placement.cores, gpus))
        except EnvironmentBroken as exc:
            if record.state is EnvState.RUNNING:
                record.to(EnvState.BROKEN, str(exc))
            return Result(Status.FAILED, detail=str(exc))
        finally:
            record.command_ended()
        return self._named_disk(record, outcome, full_before)

    @staticmethod
    def _disk_full(record: EnvRecord) -> bool:
        return record.rooted is not None and LayerStore.full(record.rooted.upper)

    def _named_disk(self, record: EnvRecord, outcome: Result, full_before: bool) -> Result:
        """A command that leaves the environment's disk full says which limit it hit (whether
        or not it failed for it: a shell may have gone on after the ENOSPC). A disk an earlier
        command filled is not this one's cause: named only when this one filled it, or failed
        on a full disk."""
        if not self._disk_full(record) or (full_before and outcome.status is Status.OK):
            return outcome
        return dataclasses.replace(
            outcome, detail=f"{outcome.detail}; disk limit {record.env.disk_mb} MiB reached"
        )

    async def execute(self, request: ExecRequest, cores: int = 1) -> Result:
        """Run one request outside a scheduler: take `cores` on the environment's node now,
        run, give them back. Raises `Infeasible` when they are not free."""
        env = self.envs.get(request.env_id)
        node = env.node if env is not None else None
        placement = self.pool.place(cores, node=node)
        action = Action(
            f"exec-{uuid.uuid4().hex[:8]}",
            {self.resource: Demand.fixed(cores)},
            trajectory=env.trajectory if env else None,
            kind="exec",
            payload=request,
        )
        try:
            return await self.run(
                Assignment(action, {self.resource: cores}, {self.resource: placement})
            )
        finally:
            self.pool.release(placement, cores)
