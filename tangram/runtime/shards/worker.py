"""One node shard: a scoped `Scheduler` over its nodes' slice of the core pools, applying what
the router sends and answering its grants. The same `ShardWorker` runs in a forked process
(`shard_main`, locally) and in a Ray actor (`tangram.runtime.shards.actors`)."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from tangram.actions import Action
from tangram.allocation import Allocator, Assignment
from tangram.pools import Pool
from tangram.profiles import DurationProfiles
from tangram.results import Status
from tangram.runtime.shards.batches import BatchStepper
from tangram.runtime.shards.wire import (
    BATCH,
    STATE,
    STOP,
    TICK,
    from_wire,
    grant_to_wire,
    wire_dumps,
    wire_loads,
)
from tangram.scheduler import Scheduler

_PR_SET_PDEATHSIG = 1
# a shard's young-object collection runs every this many allocations (Python's default: 700).
# A shard makes no cyclic garbage (its actions, grants and queue entries are freed by their
# reference counts: `python -m evaluation.shardreplay` prints what a full collection finds
# after each shard's replay, 0 at 16,384 trajectories), so the passes only cost time: 12-15% of a
# shard's CPU at the default, replayed (docs/scale.md, "Where the shards' CPU goes").
SHARD_GC_THRESHOLD = 10_000


def settle_collector() -> None:
    """A shard process's collector, once it is built: what it holds now is long-lived (frozen:
    never walked again, and never copied on write by a later fork), and young objects are
    collected every `SHARD_GC_THRESHOLD` allocations."""
    gc.enable()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(SHARD_GC_THRESHOLD, g1, g2)


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (`PR_SET_PDEATHSIG`), and
    exit at once if the parent is already gone (it died between fork and this call)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(1)


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class MirroredProfiles(DurationProfiles):
    """A shard's copy of what a decision reads from the router's profiles: the mean run time
    per kind (an elastic action carries its own fitted `T_ori`), sent before every decision."""

    def __init__(self, default: float, means: Mapping[str, float]) -> None:
        super().__init__(default)
        self.means = dict(means)

    def mean(self, kind: str) -> float | None:
        return self.means.get(kind)


def adopt(sched: Scheduler, a: Assignment, start: float) -> None:
    """Make `sched` run `a` (started at `start`) as if it had granted it: the units are taken
    in its pools already, so they are released first and taken back through its start."""
    for r, u in a.units.items():
        sched.pools[r].release(a.placement[r], u)
    sched.enqueue(a.action)
    sched._start(a, start)


class Outbox:
    """What a shard has not been told yet, in the order it must apply it."""

    __slots__ = ("unbinds", "binds", "completes", "cancels", "arrivals")

    def __init__(self) -> None:
        self.unbinds: list[str] = []
        self.binds: list[tuple[str, str, str]] = []
        self.completes: list[str] = []
        self.cancels: list[str] = []
        self.arrivals: list[tuple | Action] = []  # `wire.to_wire`

    def __reduce__(self):
        return (_outbox, (self.unbinds, self.binds, self.completes, self.cancels, self.arrivals))

    def absorb(self, later: Outbox) -> Outbox:
        """This box followed by `later`, as the router would have kept adding to one box."""
        self.unbinds += later.unbinds
        self.binds += later.binds
        self.completes += later.completes
        self.cancels += later.cancels
        self.arrivals += later.arrivals
        return self


def _outbox(unbinds, binds, completes, cancels, arrivals) -> Outbox:
    box = Outbox.__new__(Outbox)
    box.unbinds, box.binds, box.completes = unbinds, binds, completes
    box.cancels, box.arrivals = cancels, arrivals
    return box


@dataclass(frozen=True)
class ShardInit:
    """Everything a shard is built from: its pools, the allocator, the learned means, its
    nodes' bindings, and (a replacement's) the running actions to adopt and the queue."""

    pools: dict[str, Pool]
    allocator: Allocator
    default: float
    means: dict[str, float]
    bindings: list
    running: list
    queued: list[Action]


class ShardWorker:
    """The shard's state and its answer to each message (`handle`: wire bytes in and out)."""

    def __init__(self, init: ShardInit) -> None:
        self.sched = Scheduler(
            init.pools,
            init.allocator,
            profiles=MirroredProfiles(init.default, init.means),
            scoped=True,
        )
        for (t, r), n in init.bindings:
            self.sched.bind(t, r, n)
        for a, start in init.running:
            adopt(self.sched, a, start)  # a dead shard's, taken over
        for act in init.queued:
            self.sched.enqueue(act)
        self.batches = BatchStepper(self)

    def tick(self, now: float, mean_updates: dict[str, float], box: Outbox) -> list:
        """Apply what changed, decide, and answer the grants (a trailing None: a put-off class
        to re-read at the router's next decision, as the one-process scoped scheduler does; a
        trailing float: at the router's first decision at or after that time)."""
        self.sched.profiles.means.update(mean_updates)
        grants = self.apply_and_decide(now, box)
        wants = self.sched.wants_next_decision()
        if wants is True:
            grants.append(None)
        elif wants is not False:
            grants.append(float(wants))
        return grants

    def apply_and_decide(self, now: float, box: Outbox) -> list:
        """Apply `box` (in the order the router saw it) and decide: the grants as tuples."""
        sched = self.sched
        for t in box.unbinds:
            sched.unbind(t)
        for t, r, n in box.binds:
            sched.bind(t, r, n)
        for aid in box.completes:
            sched.complete(aid, now, status=Status.CANCELLED)  # the router learns
        for aid in box.cancels:
            sched.cancel(aid)
        for act in box.arrivals:
            sched.enqueue(from_wire(act) if type(act) is tuple else act)
        return self.decide(now)

    def decide(self, now: float) -> list:
        """Decide (nothing changed since the last time: a put-off class is due): the grants
        as the wire carries them (`wire.grant_to_wire`)."""
        return [grant_to_wire(a) for a in self.sched.decide(now)]

    def handle(self, data: bytes) -> tuple[bytes, bool]:
        """(the reply, whether to stop). An error is answered as ("error", text): the router
        names the shard and fails loudly."""
        msg = wire_loads(data)
        try:
            if msg[0] == BATCH:
                return wire_dumps(self.batches.run(wire_loads(msg[1]), msg[2])), False
            if msg[0] == TICK:
                return wire_dumps(self.tick(*msg[1:])), False
            if msg[0] == STATE:
                state = (list(self.sched.queue.keys()), sorted(self.sched.running))
                return wire_dumps(state), False
            if msg[0] == STOP:
                return wire_dumps(None), True
            raise ValueError(f"unknown message {msg[0]!r}")
        except Exception as exc:
            return wire_dumps(("error", f"{type(exc).__name__}: {exc}")), True


def shard_main(conn, parent: int, inherited: list, init: ShardInit) -> None:
    """A forked shard process's loop: the router's messages in, the answers out, until STOP,
    an error, or the pipe closes."""
    die_with_parent(parent)
    for c in inherited:  # the other shards' pipe ends, copied by fork
        c.close()
    worker = ShardWorker(init)
    settle_collector()
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        reply, stop = worker.handle(data)
        conn.send_bytes(reply)
        if stop:
            return
