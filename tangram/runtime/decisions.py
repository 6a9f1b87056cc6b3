"""Where the runtime's decisions run: inline on the event loop when the policy is fast, in a
worker thread when it is slow, so that no client waits on another's solver.

The heuristic decides in about a millisecond and actions can be a millisecond long: a thread
hop per decision would cost more than the decision, so a fast policy decides inline, exactly as
before. A policy marked `tangram.allocation.SlowPolicy` (the exact solvers, with a time limit of
seconds), or one whose inline decisions are measured slow (`SLOW_DECISION_S`), decides off
the loop: `Scheduler.prepare` takes a snapshot on the loop, the policy reads only that snapshot
in the worker thread, and `Scheduler.finish` applies its answer on the loop, then the liveness
and work-conservation rules on the live state. Meanwhile the loop serves every other request.

One decision at a time, whatever the mode: events that arrive while one is in flight (an
arrival, a completion, a cancel) are coalesced into one decision right after it, which reads
them all, so nothing an event asked for is lost and decisions never overlap. Decisions stay
inline on a virtual clock (`offload=False`): there a thread's wait would let virtual time run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tangram.allocation import Assignment, SlowPolicy
from tangram.scheduler import PreparedDecision
from tangram.scheduling import SchedulerInterface

log = logging.getLogger("tangram")

# inline decisions whose running mean of CPU time (weight 1/5 on the newest) passes this move the
# policy's decisions off the loop: one 2 s solve does, an occasional 60 ms one does not. CPU time
# of the loop's thread, not wall time: on a loaded machine a 1 ms decision can take 60 ms of wall
# time (measured); a policy that waits on other threads or processes declares `SlowPolicy`.
SLOW_DECISION_S = 0.05


class Decisions:
    """Runs `scheduler`'s decisions for the facade and hands each decision's starts to
    `started` (on the loop, in the order the scheduler applied them). `now`: the scheduler's
    time. `offload`: whether decisions may leave the loop at all (False on a virtual clock;
    a scheduler that does not split its decisions, the sharded one, always decides inline)."""

    def __init__(
        self,
        scheduler: SchedulerInterface,
        now: Callable[[], float],
        started: Callable[[list[Assignment]], None],
        *,
        offload: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self._now = now
        self._started = started
        self.can_offload = offload and scheduler.splits_decisions
        self.slow = self.can_offload and isinstance(scheduler.allocator, SlowPolicy)
        self.inline = 0  # decisions run on the loop
        self.offloaded = 0  # decisions whose policy ran in the worker thread
        self._inflight: asyncio.Task | None = None
        self._again = False  # an event came while a decision was in flight
        self._executor: ThreadPoolExecutor | None = None
        self.mean_inline_s = 0.0  # running mean of inline decisions' CPU time

    @property
    def in_flight(self) -> bool:
        return self._inflight is not None

    def kick(self) -> None:
        """An event happened: decide now (inline), start deciding (off the loop), or, when a
        decision is in flight, decide once more right after it."""
        if self._inflight is not None:
            self._again = True
            return
        if self.slow:
            self._offload()
            return
        asked = bool(self.scheduler.queue)
        t0 = time.thread_time()  # CPU time: a loaded machine's descheduling is not the policy's
        granted = self.scheduler.decide(self._now())
        took = time.thread_time() - t0
        if asked:  # an empty queue asks the policy nothing: it says nothing of its speed
            self.inline += 1
            self.mean_inline_s += (took - self.mean_inline_s) / 5
        if self.can_offload and self.mean_inline_s > SLOW_DECISION_S:
            self.slow = True
            log.info(
                "decisions: the last took %.3f s: the policy decides off the event loop "
                "from now on",
                took,
            )
        self._started(granted)

    def _offload(self) -> None:
        prepared = self.scheduler.prepare(self._now())
        if prepared is None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="tangram-decide")
        loop = asyncio.get_running_loop()
        answer = loop.run_in_executor(self._executor, prepared.allocate)
        self._inflight = loop.create_task(self._finish(prepared, answer))

    async def _finish(self, prepared: PreparedDecision, answer: asyncio.Future) -> None:
        try:
            assignments = await answer
        except Exception:  # a policy bug: its actions stay queued for the next decision
            log.exception("decisions: the policy raised; its actions stay queued")
            assignments = []
        granted: list[Assignment] = []
        try:
            granted = self.scheduler.finish(prepared, assignments, self._now())
            self.offloaded += 1
        except Exception:  # a broken invariant: loud, as inline, but the loop goes on
            log.exception("decisions: applying the policy's answer failed")
        finally:
            self._inflight = None
        self._started(granted)
        if self._again:
            self._again = False
            self.kick()

    async def close(self) -> None:
        """Wait for the decision in flight (its starts are handed over as usual), then stop the
        worker thread."""
        while self._inflight is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._inflight)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
