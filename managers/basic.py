"""The basic manager (paper 5.1) for non-scalable resources: website quotas, QPS limits.

Two modes, combinable per resource: *concurrency* (at most N actions in flight) and *quota* (at
most N uses per period, sliding window). A quota use occupies the window from its start until
one period after it *ends*, so however long the upstream takes to see a request, no window of
the upstream's clock ever holds more than N of them: flow control keeps it under its limit.
The pool the scheduler sees has one unit per concurrency slot; the gate is the enforcement.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from managers.base import Manager
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import FlatPool, Pool
from tangram.results import Result, Status

NODE = "basic"


@dataclass(frozen=True, slots=True)
class Limits:
    """`concurrency`: at most this many in flight; `quota` uses per `period_s` (sliding)."""

    concurrency: int | None = None
    quota: int | None = None
    period_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "quota"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValidationError(f"limits.{name}", v, "must be a positive integer or None")
        p = self.period_s
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
            raise ValidationError("limits.period_s", p, "must be a finite positive number")
        if self.concurrency is None and self.quota is None:
            raise ValidationError("limits", self, "set concurrency, quota or both")

    @property
    def slots(self) -> int:
        """Units of the pool the scheduler sees."""
        return self.concurrency if self.concurrency is not None else self.quota  # type: ignore


class Gate:
    """Enforces one resource's `Limits`; FIFO among waiters. `clock` must be monotonic."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._slots = asyncio.Semaphore(limits.concurrency) if limits.concurrency else None
        self._order = asyncio.Lock()
        self._changed = asyncio.Event()
        self._active = 0  # quota uses in flight
        self._ends: deque[float] = deque()  # end times of finished uses still in the window
        self.in_flight = 0
        self.uses = 0
        self.throttled = 0  # uses that waited for the quota window (flow control at work)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One in-flight action (concurrency mode)."""
        if self._slots is None:
            self.in_flight += 1
            try:
                yield
            finally:
                self.in_flight -= 1
            return
        async with self._slots:
            self.in_flight += 1
            try:
                yield
            finally:
                self.in_flight -= 1

    @asynccontextmanager
    async def use(self) -> AsyncIterator[None]:
        """One use of the quota (each HTTP attempt, retries included)."""
        q = self.limits.quota
        if q is None:
            yield
            return
        async with self._order:
            waited = False
            while True:
                now = self.clock()
                while self._ends and self._ends[0] + self.limits.period_s <= now:
                    self._ends.popleft()
                if self._active + len(self._ends) < q:
                    break
                waited = True
                self._changed.clear()
                wait = (self._ends[0] + self.limits.period_s - now) if self._ends else None
                try:
                    await asyncio.wait_for(self._changed.wait(), wait)
                except TimeoutError:
                    pass
            self._active += 1
            self.uses += 1
            self.throttled += waited
        try:
            yield
        finally:
            self._active -= 1
            self._ends.append(self.clock())
            self._changed.set()


Execute = Callable[[Assignment], Awaitable[Any]]


class BasicManager(Manager):
    """Owns one flat pool per named resource and a gate per resource.

    `execute(assignment)` does the work of an action (default: await the payload, which must be
    an async callable taking no argument); its return value is the outcome's `output`, and an
    exception becomes an "error" outcome. Every use is inside the gate of each resource the
    action demands from this manager.
    """

    name = "basic"

    def __init__(
        self,
        resources: Mapping[str, Limits],
        execute: Execute | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not resources:
            raise ValidationError("resources", resources, "name at least one resource")
        self.limits = dict(resources)
        self.gates = {r: Gate(lim, clock) for r, lim in resources.items()}
        self._pools = {r: FlatPool(r, {NODE: lim.slots}) for r, lim in resources.items()}
        self._execute = execute

    def pools(self) -> Mapping[str, Pool]:
        return self._pools

    def _mine(self, assignment: Assignment) -> list[str]:
        return [r for r in assignment.action.demands if r in self.gates]

    async def run(self, assignment: Assignment) -> Result:
        mine = self._mine(assignment)
        if not mine:
            return Result(
                Status.FAILED,
                detail=f"action {assignment.action_id} demands none of {sorted(self.gates)}",
            )
        return await self._in_slots(mine, assignment)

    async def _in_slots(self, resources: list[str], assignment: Assignment) -> Result:
        if not resources:
            return await self.perform(assignment, [self.gates[r] for r in self._mine(assignment)])
        async with self.gates[resources[0]].slot():
            return await self._in_slots(resources[1:], assignment)

    async def perform(self, assignment: Assignment, gates: list[Gate]) -> Result:
        """Do the action inside its concurrency slots; each use goes through `gates`' quotas."""
        try:
            async with _uses(gates):
                if self._execute is not None:
                    output = await self._execute(assignment)
                else:
                    payload = assignment.action.payload
                    if not callable(payload):
                        return Result(
                            Status.FAILED,
                            detail=f"action {assignment.action_id}: "
                            "payload must be an async callable for a basic resource",
                        )
                    output = await payload()
        except Exception as exc:
            return Result(Status.ERROR, detail=f"{type(exc).__name__}: {exc}")
        return Result(Status.OK, output=output, detail="done")


@asynccontextmanager
async def _uses(gates: list[Gate]) -> AsyncIterator[None]:
    if not gates:
        yield
        return
    async with gates[0].use(), _uses(gates[1:]):
        yield
