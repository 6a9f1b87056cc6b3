"""`SchedulerInterface`: what the runtime may ask of a scheduler, the one in this process
(`tangram.scheduler.Scheduler`) or the one sharded over node processes
(`tangram.runtime.shards.ShardedScheduler`). Both implement it structurally; the runtime's
facade and its decisions (`tangram.runtime.decisions`) hold a scheduler only by it, so they
never ask which kind they hold.

The contract, as HiveD numbers its scheduler algorithm's:

1. One caller at a time, on one thread (the event loop): no method is thread-safe. Only a
   `PreparedDecision.allocate` runs elsewhere, and it reads nothing but its own snapshot.
2. `submit` validates and queues (`ValidationError`, `Infeasible` for what can never run,
   `QueueFull` past the queue's bound); `cancel` drops a queued action only (False when it
   is running or unknown). Nothing starts before the next decision.
3. A decision (`decide`, or `prepare` then `finish` where `splits_decisions`) returns the
   actions it started, their units already taken; the caller runs each one and reports its
   end exactly once with `complete`, which returns the units and teaches the profiles.
4. After any event (a submission, a completion, a cancel, a binding) the caller decides again;
   a scheduler never decides by itself.
5. `take_failed`, after each decision, hands over the queued actions that failed without
   running (a lost shard's): each is failed to its caller, never started.
6. `close` stops what the scheduler runs beside this process; nothing is called after it.

This lives in the core, beside `Scheduler` and below the runtime that holds the sharded one,
because it is the scheduler's contract: the core says what a scheduler promises, and the
runtime's implementation promises it (the layering of docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from tangram.actions import Action
from tangram.allocation import Allocator, Assignment, RunningAction
from tangram.bindings import Bindings
from tangram.errors import TangramError
from tangram.pools import Pool
from tangram.profiles import DurationProfiles
from tangram.results import Status
from tangram.scheduler import PreparedDecision


class QueuedActions(Protocol):
    """The queued actions, read-only (`tangram.queue.ActionQueue`, the sharded one's view of
    every shard's queue): their number, and each by id."""

    def __len__(self) -> int: ...

    def __contains__(self, item: object) -> bool: ...

    def get(self, action_id: str) -> Action | None: ...

    def keys(self) -> Iterable[str]: ...

    def values(self) -> Iterable[Action]: ...


class SchedulerInterface(Protocol):
    """The scheduler as the runtime drives it (the module docstring's numbered contract)."""

    allocator: Allocator  # the policy (a bench may wrap it to time it)

    @property
    def pools(self) -> Mapping[str, Pool]:
        """Every pool by resource, as the scheduler holds them (read, never changed here)."""

    @property
    def profiles(self) -> DurationProfiles:
        """The duration estimates every decision reads and every completion teaches."""

    @property
    def bindings(self) -> Bindings:
        """trajectory, resource -> node: where a trajectory's actions of that resource run."""

    @property
    def queue(self) -> QueuedActions: ...

    @property
    def running(self) -> Mapping[str, RunningAction]: ...

    @property
    def decisions(self) -> int:
        """How many decisions it has made (one that finds the queue empty is none)."""

    @property
    def places_vector_actions(self) -> bool:
        """Whether one action may take units of a per-node pool and of another pool together
        (a vector exec: cores and a GPU chunk of one machine, `Tangram.exec(gpus=)`)."""

    @property
    def splits_decisions(self) -> bool:
        """Whether `prepare` and `finish` split a decision so that its policy may run off the
        event loop; where False it decides inline only, by `decide`."""

    # -- admission -----------------------------------------------------------------------------
    def submit(self, action: Action) -> None: ...

    def cancel(self, action_id: str) -> bool: ...

    def bind(self, trajectory: str, resource: str, node: str) -> None: ...

    def unbind(self, trajectory: str) -> None: ...

    def attach_bindings(self, resource: str, owner: Mapping[str, str]) -> None:
        """Let `owner` (trajectory -> node, kept by the environments' owner: the CPU manager)
        answer for `resource`, so there is one binding record, where this scheduler can read
        one it does not keep itself (`Bindings.attach`)."""

    # -- decisions -----------------------------------------------------------------------------
    def decide(self, now: float) -> list[Assignment]: ...

    def prepare(self, now: float) -> PreparedDecision | None:
        """Only where `splits_decisions`: the decision's snapshot (None: nothing to decide)."""

    def finish(
        self, prepared: PreparedDecision, assignments: list[Assignment], now: float
    ) -> list[Assignment]:
        """Only where `splits_decisions`: apply a prepared decision's answer at `now`."""

    def complete(
        self, action_id: str, now: float, run_s: float | None = None, status: Status = Status.OK
    ) -> RunningAction: ...

    def take_failed(self) -> Sequence[tuple[str, TangramError]]: ...

    def close(self) -> None: ...
