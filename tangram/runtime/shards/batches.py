"""A node shard's side of a batch: the decisions of many router instants in one message.

On the virtual clock the router does not ask its shards at every instant: it collects each
shard's work instant by instant (what changed there, as the `Outbox` of that instant) and sends
it in one message once the simulator must know the grants (`ShardedScheduler(batched=True)`,
docs/scale.md "Batches"). The shard then replays the instants in order, deciding exactly where
the per-instant protocol would have asked it:

- at an instant with work for it, when its queue (after that instant's cancels and arrivals) is
  not empty; with an empty queue the router would not have asked it, so the work is held and
  applied at the next instant it decides at, as the router would have held it;
- at the first instant at or after the time a put-off class asked to be read again (or the
  next instant, when it asked for the next decision), when its queue is not empty;
- with the learned means as of that instant: the message carries the means at the batch's
  first instant and every change after it, by instant.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

NEVER = 1 << 62  # an instant index past any batch


class BatchStepper:
    """Runs one batch on a shard worker (`ShardWorker`: `sched`, `apply_and_decide`) and keeps
    what lasts from one batch to the next: the work held while the queue was empty, and when
    the shard wants to decide again (`wake`: False, True for the next instant, or a time)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.held = None  # an Outbox not applied yet: the shard's queue was empty
        self.wake: bool | float = False

    def run(self, common: tuple, ticks: list) -> tuple[list, bool | float]:
        """`common`: (the instants, the means at the first, [(instant, {kind: mean})]);
        `ticks`: [(instant, Outbox)] in order. The answer: [(instant, grants)] for the instants
        it decided at, and whether (True) or from when (a time) it wants to decide again."""
        instants, base, changes = common
        means = self.worker.sched.profiles.means
        means.update(base)
        out: list = []
        ci, ti = 0, 0
        due = self._due(instants, -1)
        while True:
            at_tick = ticks[ti][0] if ti < len(ticks) else NEVER
            k = min(at_tick, due)
            if k == NEVER:
                break
            while ci < len(changes) and changes[ci][0] <= k:
                means.update(changes[ci][1])
                ci += 1
            box = None
            if at_tick == k:
                box = ticks[ti][1]
                ti += 1
            grants = self.step(instants[k], box)
            if grants is not None:
                out.append((k, grants))
            due = self._due(instants, k)
        for _, m in changes[ci:]:
            means.update(m)
        return out, (self.wake if len(self.worker.sched.queue) else False)

    def _due(self, instants: list[float], k: int) -> int:
        """The first instant after index `k` the shard decides at unasked (NEVER: none)."""
        wake = self.wake
        if wake is False or not len(self.worker.sched.queue):
            return NEVER
        j = k + 1 if wake is True else bisect_left(instants, wake, k + 1)
        return j if j < len(instants) else NEVER

    def step(self, now: float, box) -> list | None:
        """Decide at `now` with `box` (None: a put-off class is due), or hold the work when the
        queue would be empty (None answered)."""
        held = self.held
        if box is not None:
            held = box if held is None else held.absorb(box)
        queue = self.worker.sched.queue
        if held is None or not held.arrivals:
            n = len(queue) - (sum(c in queue for c in held.cancels) if held is not None else 0)
            if n <= 0:
                self.held = held
                return None
        self.held = None
        worker = self.worker
        grants = worker.apply_and_decide(now, held) if held is not None else worker.decide(now)
        wants = worker.sched.wants_next_decision()
        self.wake = wants if wants is True or wants is False else float(wants)
        return grants


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


def parse_ops(ops: list, box: Callable[[], Any]) -> list[tuple[int, Any]]:
    """A shard's op stream as [(instant, Outbox)] (`box` makes an empty one)."""
    out, cur = [], box()
    for op in ops:
        t = type(op)
        if t is str:
            cur.completes.append(op)
        elif t is int:
            out.append((op, cur))
            cur = box()
        elif t is tuple:
            getattr(cur, op[0]).append(op[1])
        else:
            cur.arrivals.append(op)
    return out


class OpenBatch:
    """The router's side: the instants decided since the last batch was sent (`ShardedScheduler`
    with `batched=True`), and what the shards answered that the simulator has not collected."""

    def __init__(self, shards: int) -> None:
        self.first_id = 0  # the id of `instants[0]`: instants are numbered from the first
        self.instants: list[float] = []
        self.queued: list[int] = []  # the router's count of queued actions at each instant
        self.inline: list[list] = []  # the global shard's grants at each (decided at once)
        self.base: dict[str, float] = {}  # the learned means at the first instant
        self.changes: list[tuple[int, dict[str, float]]] = []  # (instant, means) after it
        self.changed: set[str] = set()  # kinds learned since the last instant
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
        self.instants, self.queued, self.inline, self.changes = [], [], [], []
