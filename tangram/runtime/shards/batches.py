"""A node shard's side of a batch: the decisions of many router instants in one message.

On the virtual clock the router does not ask its shards at every instant: it collects each
shard's work instant by instant (what changed there, as the `Outbox` of that instant) and sends
it in one message once the simulator must know the grants (`ShardedScheduler(batched=True)`,
docs/scale.md "Batches"). The shard then replays the instants in order, deciding exactly where
the per-instant protocol would have asked it:

- at an instant with work for it, when its queue (after that instant's ops) is not empty (with
  an empty queue the router would not have asked it; the work is applied all the same, which
  changes what the next decision reads exactly as the router's holding it until then would);
- at the first instant at or after the time a put-off class asked to be read again (or the
  next instant, when it asked for the next decision), when its queue is not empty;
- with the learned means as of that instant: the message carries the means at the batch's
  first instant and every change after it, by instant.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Any

from tangram.results import Status
from tangram.runtime.shards.wire import from_wire

NEVER = 1 << 62  # an instant index past any batch
_CANCELLED = Status.CANCELLED  # how a shard completes: the router learns, not the shard


class BatchStepper:
    """Runs one batch on a shard worker (`ShardWorker`: `sched`, `decide`) and keeps when the
    shard wants to decide again from one batch to the next (`wake`: False, True for the next
    instant, or a time).

    The op stream is applied as it comes, each op at its instant: work that arrives while the
    queue stays empty changes what the next decision reads exactly as it would have changed it
    applied then (a completion returns its units and touches its class; the learning is the
    router's), so nothing is held back, and no per-instant box is built."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.wake: bool | float = False

    def run(self, common: tuple, ops: list) -> tuple[list, bool | float]:
        """`common`: (the instants, the means at the first, the changes after it as
        (instants, kinds, means), `MeanChanges.wire`); `ops`:
        the shard's op stream (`Ops`), each instant's ops followed by its index. The answer:
        [(instant, grants)] for the instants it decided at, and whether (True) or from when
        (a time) it wants to decide again."""
        instants, base, changes = common
        sched = self.worker.sched
        means = sched.profiles.means
        means.update(base)
        queue = sched.queue
        apply, decide = self._apply, self._decide
        out: list = []
        ci = 0
        start = 0
        due = self._due(instants, -1)
        for pos in [p for p, op in enumerate(ops) if type(op) is int]:
            k = ops[pos]
            while due < k:  # a put-off class due before this instant's work
                ci = _means_until(changes, ci, due, means)
                due = decide(instants, due, out)
            apply(ops[start:pos], instants[k])  # (reads no mean)
            start = pos + 1
            if len(queue):  # an empty queue: the router would not have asked it
                ci = _means_until(changes, ci, k, means)
                due = decide(instants, k, out)
            else:
                due = NEVER
        while due != NEVER:
            ci = _means_until(changes, ci, due, means)
            due = decide(instants, due, out)
        _means_until(changes, ci, NEVER, means)
        return out, (self.wake if len(queue) else False)

    def _apply(self, ops: list, now: float) -> None:
        """Apply `ops` in order, at `now`."""
        sched = self.worker.sched
        for op in ops:
            t = type(op)
            if t is str:
                sched.complete(op, now, status=_CANCELLED)  # the router learns
            elif t is not tuple:
                sched.enqueue(op)  # an action `to_wire` left as it is
            elif len(op) != 2:
                sched.enqueue(from_wire(op))
            else:
                tag, v = op
                if tag == "cancels":
                    sched.cancel(v)
                elif tag == "binds":
                    sched.bind(*v)
                elif tag == "unbinds":
                    sched.unbind(v)
                else:
                    raise ValueError(f"unknown op {tag!r}")

    def _decide(self, instants: list[float], k: int, out: list) -> int:
        """Decide at instant `k`; the next instant the shard decides at unasked (`_due`)."""
        worker = self.worker
        out.append((k, worker.decide(instants[k])))
        wants = worker.sched.wants_next_decision()
        if wants is False:
            self.wake = False
            return NEVER
        self.wake = wants if wants is True else float(wants)
        return self._due(instants, k)

    def _due(self, instants: list[float], k: int) -> int:
        """The first instant after index `k` the shard decides at unasked (NEVER: none)."""
        wake = self.wake
        if wake is False or not len(self.worker.sched.queue):
            return NEVER
        j = k + 1 if wake is True else bisect_left(instants, wake, k + 1)
        return j if j < len(instants) else NEVER


def _means_until(changes: tuple, ci: int, k: int, means: dict) -> int:
    """Apply the mean changes (`MeanChanges.wire`) up to instant `k` from index `ci` on; the
    next index."""
    at, kinds, values = changes
    n = len(at)
    while ci < n and at[ci] <= k:  # (most often none: nothing learned since the last decision)
        means[kinds[ci]] = values[ci]
        ci += 1
    return ci


class MeanChanges:
    """The means learned after a batch's first instant, each with the instant it was learned
    before, in order: kept as three columns so that a shard reads the numbers without making an
    object of each (`wire`)."""

    __slots__ = ("at", "kinds", "means")

    def __init__(self) -> None:
        self.at: list[int] = []
        self.kinds: list[str] = []
        self.means: list[float] = []

    def append(self, instant: int, kind: str, mean: float) -> None:
        self.at.append(instant)
        self.kinds.append(kind)
        self.means.append(mean)

    def wire(self) -> tuple[array, list[str], array]:
        return array("q", self.at), self.kinds, array("d", self.means)

    def triples(self) -> list[tuple[int, str, float]]:
        return list(zip(self.at, self.kinds, self.means))


class _Tagged:
    """Appends `(tag, value)` to a shard's op stream: the rare ops (cancel, bind, unbind)."""

    __slots__ = ("ops", "tag")

    def __init__(self, ops: list, tag: str) -> None:
        self.ops, self.tag = ops, tag

    def append(self, value: Any) -> None:
        self.ops.append((self.tag, value))


class Ops:
    """A shard's work in the open batch as one flat stream, in the order it happened, so
    that the router creates nothing per instant: an arrival is its `Action`, a completion
    its id, a cancel, bind or unbind a tagged tuple, and each instant the shard is to decide
    at its index (an int). It answers what an `Outbox` answers (`arrivals.append`, ...)."""

    __slots__ = ("arrivals", "completes", "cancels", "binds", "unbinds", "cut")

    def __init__(self, ops: list | None = None) -> None:
        ops = [] if ops is None else ops
        self.arrivals = self.completes = ops
        self.cancels = _Tagged(ops, "cancels")
        self.binds = _Tagged(ops, "binds")
        self.unbinds = _Tagged(ops, "unbinds")
        self.cut = 0  # the ops up to the last instant: what the batch sends

    def mark(self, instant: int) -> None:
        self.arrivals.append(instant)
        self.cut = len(self.arrivals)

    def split(self) -> tuple[list, Ops]:
        """(the ops up to the last instant marked, the rest as a new stream)."""
        ops = self.arrivals
        return ops[: self.cut], Ops(ops[self.cut :])


class OpenBatch:
    """The router's side: the instants decided since the last batch was sent (`ShardedScheduler`
    with `batched=True`), and what the shards answered that the simulator has not collected."""

    def __init__(self, shards: int) -> None:
        self.first_id = 0  # the id of `instants[0]`: instants are numbered from the first
        self.instants: list[float] = []
        self.queued: list[int] = []  # the router's count of queued actions at each instant
        self.inline: dict[int, list] = {}  # the global shard's grants by instant, where any
        self.base: dict[str, float] = {}  # the learned means at the first instant
        self.changes = MeanChanges()  # learned after the first instant, each before which
        self.wake: list[bool | float] = [False] * shards  # as each shard last answered
        self.ready: list[tuple[int, float, list]] = []  # (id, time, grants) not collected

    def wants(self, i: int) -> bool:
        """Whether shard i must be sent this batch although no instant has work for it: a
        put-off class of it is due by the batch's last instant."""
        w = self.wake[i]
        return w is True or (w is not False and bool(self.instants) and w <= self.instants[-1])

    def close(self) -> None:
        """The instants are sent and answered: the next batch starts after them."""
        self.first_id += len(self.instants)
        self.instants, self.queued, self.inline = [], [], {}
        self.changes = MeanChanges()
