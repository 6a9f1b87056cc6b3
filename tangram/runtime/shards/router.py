"""The router: `ShardedScheduler`, the scheduler's interface over node shards plus the global
shard (the package's docstring, docs/scale.md "Shards")."""

from __future__ import annotations

import logging
import math
import time
from array import array
from collections import deque
from collections.abc import Mapping

from tangram.actions import Action
from tangram.allocation import Allocator, Assignment, RunningAction
from tangram.errors import InvariantError, QueueFull, TangramError, ValidationError
from tangram.pools import CorePool, Pool
from tangram.profiles import CENSORED, LEARNED, DurationProfiles
from tangram.results import Status
from tangram.runtime.shards.actors import RayShard, ray_is_running
from tangram.runtime.shards.batches import OpenBatch, Ops
from tangram.runtime.shards.handles import ProcessShard, ShardHandle
from tangram.runtime.shards.means import MeansMirror
from tangram.runtime.shards.pending import place_pending
from tangram.runtime.shards.views import QueueView, ShardLost
from tangram.runtime.shards.wire import (
    BATCH,
    STATE,
    TICK,
    assignment,
    grant_from_wire,
    running_action,
    to_wire,
    wire_dumps,
    wire_loads,
)
from tangram.runtime.shards.worker import Outbox, ShardInit
from tangram.scheduler import DEFAULT_MAX_QUEUE, PreparedDecision, Scheduler
from tangram.sharding import GLOBAL, ShardLayout

log = logging.getLogger("tangram.shards")
PENDING = -2  # `_where` of an action waiting for its trajectory's node
_NAN = math.nan  # a batched grant's expected end until read (`running`)
BACKENDS = {"process": ProcessShard, "ray": RayShard}


def _core_pool(pools: Mapping[str, Pool]) -> list[str]:
    """The per-node core pool whose nodes split into shards (none on a GPU-only cluster); a
    second one is refused, since a first action's nodes would be chosen pool by pool."""
    sharded = [r for r, p in pools.items() if isinstance(p, CorePool)]
    if len(sharded) > 1:
        raise ValidationError(
            "pools",
            sorted(sharded),
            "a sharded scheduler splits the nodes of one core pool; every other resource "
            "must be pooled",
        )
    return sharded


def _at_most(counts: list[int], n: int) -> int:
    """How many of `counts` are at most `n` (most often none: `min` finds that in C)."""
    if not counts or min(counts) > n:
        return 0
    return sum(1 for q in counts if q <= n)


class ShardedScheduler:
    """The scheduler's interface (`tangram.scheduling.SchedulerInterface`) over `shards` node
    shards plus the global shard (module docstring). Node shards always decide scoped (a shard
    decides what an event touched)."""

    # a node shard holds one node's cores, the global shard the GPUs: no grant spans both
    places_vector_actions = False
    # its node shards decide in their own processes, in parallel: it decides inline only
    splits_decisions = False

    def __init__(
        self,
        pools: Mapping[str, Pool],
        allocator: Allocator,
        *,
        shards: int,
        profiles: DurationProfiles | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        scoped: bool = True,
        max_restarts: int = 3,
        log_stream: bool = False,
        backend: str = "auto",
        start: bool = True,
        batched: bool = False,
    ) -> None:
        """`backend`: where each node shard runs, "process" (forked here), "ray" (a Ray
        actor), or "auto": a Ray actor when this process is connected to Ray. `start=False`:
        no shard yet (`take_over` fills the router, then calls `start_shards`). `batched`:
        the node shards' grants are answered later, by `collect`, many instants in one message
        per shard (for the simulator's event loop: docs/scale.md "Batches"). `log_stream`:
        keep each decision's grants in `stream`, as ("granted", time, grants) in decision
        order (`evaluation.shardcheck.compare` reads them)."""
        if backend == "auto":
            backend = "ray" if ray_is_running() else "process"
        if backend not in BACKENDS:
            raise ValidationError("shards.backend", backend, f"one of auto, {', '.join(BACKENDS)}")
        self.backend = backend
        self._start_shard = BACKENDS[backend].start
        self.pools = dict(pools)
        self.allocator = allocator
        sharded = _core_pool(self.pools)
        nodes = list(dict.fromkeys(n for r in sharded for n in self.pools[r].nodes()))
        # no core pool (a GPU-only cluster): everything is the global shard's
        self.layout = (
            ShardLayout.contiguous(sharded, nodes, shards) if sharded else ShardLayout((), ())
        )
        shards = len(self.layout.groups)
        # the global shard: every pooled resource, in this process (scoped as asked)
        self._global = Scheduler(
            self.pools, allocator, profiles=profiles, max_queue=max_queue, scoped=scoped
        )
        self.profiles = self._global.profiles
        self.bindings = self._global.bindings  # one binding table: the router's
        self.max_queue = max_queue
        self.max_restarts = max_restarts
        self._init_state(shards, batched, log_stream)
        self._shards: list[ShardHandle] = []
        if start:
            self.start_shards()

    def _init_state(self, shards: int, batched: bool, log_stream: bool) -> None:
        self.decisions = 0
        self.messages = 0  # sent to node shards (each answered once)
        self.restarts = [0] * shards
        self.failed: dict[str, ShardLost] = {}  # action id -> why it failed
        self.last_scope = None
        self._where: dict[str, int] = {}  # queued or running action -> shard (GLOBAL, PENDING)
        self._queued: list[dict[str, Action]] = [{} for _ in range(shards)]
        self._in_shards = 0  # actions queued on node shards, all of them (`queued` in O(1))
        self._running: list[dict[str, RunningAction]] = [{} for _ in range(shards)]
        self._pending: deque[Action] = deque()  # first CPU actions of unbound trajectories
        self.defers_grants = batched
        self._out = [self._new_box() for _ in range(shards)]
        self._untaken: dict[str, Assignment] = {}  # batched: grants not in the mirror yet
        self._dirty: set[int] = set()
        self._due: dict[int, float] = {}  # shard -> when a put-off class of it is to be re-read
        self._dead: set[int] = set()
        self._means = MeansMirror(self.profiles, shards)
        self.stream: list[tuple] | None = [] if log_stream else None
        self._batch = OpenBatch(shards)
        self.last_instant: int | None = None  # the id of the last decision's instant (batched)
        self.wire_s: dict[str, float] | None = None  # action -> its grant's round trip (wall s)

    # -- processes --------------------------------------------------------------------------------
    def start_shards(self) -> None:
        """Start every node shard from the router's copies (its running and queued actions)."""
        assert not self._shards, "shards already started"
        for i in range(len(self.layout.groups)):
            running = [(ra.assignment, ra.start) for ra in self._running[i].values()]
            self._out[i] = self._new_box()  # all of it is in the copies
            self._shards.append(self._spawn(i, running, list(self._queued[i].values())))

    def _spawn(self, i: int, running: list, queued: list[Action]) -> ShardHandle:
        nodes = self.layout.groups[i]
        mine = set(nodes)
        pools: dict[str, Pool] = {}
        for r in self.layout.resources:
            pool = self.pools[r]
            have = set(pool.nodes())
            pools[r] = CorePool(r, {n: pool.cpu_node(n) for n in nodes if n in have})
        init = ShardInit(
            pools,
            self.allocator,
            self.profiles.default,
            self._means.for_new(i),
            [(k, n) for k, n in self.bindings.items() if n in mine],
            running,
            queued,
        )
        others = [s for s in self._shards if s.index != i]
        return self._start_shard(i, nodes, init, others)

    def describe(self) -> str:
        """The layout in one line: shards, nodes per shard, the global shard's resources."""
        sizes = sorted({len(g) for g in self.layout.groups})
        pooled = sorted(set(self.pools) - set(self.layout.resources))
        each = "Ray actor" if self.backend == "ray" else "process"
        return (
            f"{len(self.layout.groups)} node shards x {'-'.join(map(str, sizes))} nodes "
            f"({', '.join(self.layout.resources)}), each a {each}; global shard "
            f"(in the router): {', '.join(pooled) or 'nothing pooled'}"
        )

    def shard_pids(self) -> list[int | None]:
        return [s.pid for s in self._shards]

    def shard_cpu_s(self) -> list[float]:
        """Each node shard's own CPU seconds so far (a process: read from /proc; an actor: as
        its process counts them; 0 for a dead one)."""
        return [s.cpu_s() for s in self._shards]

    def close(self) -> None:
        for s in self._shards:
            s.stop()
        for s in self._shards:
            s.reap(timeout=5)

    def __enter__(self) -> ShardedScheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- admission --------------------------------------------------------------------------------
    @property
    def queue(self) -> QueueView:
        """Every queued action (the global shard's, the pending, each node shard's; batched:
        with those a shard started in the open batch). Built when read, not when counted."""
        return QueueView(self._all_queued, self.queued())

    def _all_queued(self) -> dict[str, Action]:
        out = dict(self._global.queue.items())
        out.update((a.id, a) for a in self._pending)
        for q in self._queued:
            out.update(q)
        return out

    @property
    def running(self) -> dict[str, RunningAction]:
        """Every running action by id, as the router holds them."""
        out = dict(self._global.running)
        for r in self._running:
            out.update(r)
        for aid, ra in out.items():
            if math.isnan(ra.expected_end):
                out[aid] = RunningAction(
                    ra.assignment, ra.start, ra.start + self._estimate_of(ra.assignment)
                )
        return out

    def queued(self) -> int:
        return len(self._global.queue) + len(self._pending) + self._in_shards

    def validate(self, action: Action) -> None:
        self._global.validate(action)
        self.layout.route(action, self.bindings)  # refuses a demand no shard can decide

    def node_of(self, action: Action, resource: str) -> str | None:
        return self._global.node_of(action, resource)

    def submit(self, action: Action) -> None:
        if action.id in self._where:
            raise ValidationError("action.id", action.id, "already queued or running")
        if self.queued() >= self.max_queue:
            raise QueueFull(f"the queue holds its maximum of {self.max_queue} actions; retry later")
        self.validate(action)
        self.enqueue(action)

    def enqueue(self, action: Action) -> None:
        i = self.layout.route(action, self.bindings)
        if i == GLOBAL:
            self._where[action.id] = GLOBAL
            self._global.enqueue(action)
        elif i is None or self._pending:
            # no node yet, or behind one that has none: FCFS on the cores, as one scheduler
            self._where[action.id] = PENDING
            self._pending.append(action)
        else:
            self._to_shard(i, action)

    def _to_shard(self, i: int, action: Action) -> None:
        if i in self._dead:
            raise ShardLost(f"action {action.id}: shard {i} ({self._span(i)}) is lost")
        self._where[action.id] = i
        self._queued[i][action.id] = action
        self._in_shards += 1
        self._out[i].arrivals.append(to_wire(action))
        self._dirty.add(i)

    def cancel(self, action_id: str) -> bool:
        self.settle()  # its shard may have started it in the open batch
        i = self._where.get(action_id)
        if i is None:
            return False
        if i == GLOBAL:
            ok = self._global.cancel(action_id)
        elif i == PENDING:
            act = next((a for a in self._pending if a.id == action_id), None)
            ok = act is not None
            if ok:
                self._pending.remove(act)
        else:
            ok = self._queued[i].pop(action_id, None) is not None
            if ok:
                self._in_shards -= 1
                self._out[i].cancels.append(action_id)
                self._dirty.add(i)
        if ok:
            del self._where[action_id]
        return ok

    def bind(self, trajectory: str, resource: str, node: str) -> None:
        if self.bindings.get((trajectory, resource)) == node:
            return
        self._global.bind(trajectory, resource, node)
        if resource in self.layout.resources:
            self._out[self.layout.shard_of(node)].binds.append((trajectory, resource, node))

    def attach_bindings(self, resource: str, owner: Mapping[str, str]) -> None:
        """Keeps its own table: every bind must pass through `bind`, which forwards it to the
        node's shard (an attached owner would already hold the node, so `bind` would skip it)."""

    def unbind(self, trajectory: str) -> None:
        for r in self.layout.resources:
            node = self.bindings.get((trajectory, r))
            if node is not None:
                self._out[self.layout.shard_of(node)].unbinds.append(trajectory)
        self._global.unbind(trajectory)

    # -- decisions ----------------------------------------------------------------------------
    def estimate(self, action: Action, units: int | None = None) -> float:
        return self.profiles.estimate(action, units)

    def decide(self, now: float) -> list[Assignment]:
        """Bind waiting first actions, ask every shard that an event touched (in parallel), the
        global shard meanwhile, and gather the grants."""
        if self.defers_grants and not self._pending:
            g = len(self._global.queue)  # the batched common case (the simulator's instants)
            if not g and not self._in_shards:
                return []
            return self._decide_later(now, g + self._in_shards, g)
        queued = self.queued()
        if not queued:
            return []
        if self._pending:
            self.settle()  # the placement reads the core pools: every grant must be in them
            self.sync_pools()
            place_pending(
                self._pending,
                self.layout,
                self.bindings,
                self.pools,
                self.bind,
                self._to_shard,
                (a for q in self._queued for a in q.values()),
            )
        if self.defers_grants:
            return self._decide_later(now, queued, len(self._global.queue))
        self.decisions += 1
        self._dirty.update(i for i, t in self._due.items() if t <= now)
        asked = [i for i in sorted(self._dirty) if self._queued[i]]
        self._dirty.difference_update(asked)
        for i in asked:
            self._send_tick(i, now)
        out = self._global.decide(now)
        for i in asked:
            out.extend(self._receive(i, now))
        self._log("granted", now, tuple(out))
        return out

    def prepare(self, now: float) -> PreparedDecision | None:
        """Never called: `splits_decisions` is False (its shards decide in their processes)."""
        raise InvariantError("the sharded scheduler decides inline only (`decide`)")

    def finish(
        self, prepared: PreparedDecision, assignments: list[Assignment], now: float
    ) -> list[Assignment]:
        """Never called, as `prepare`."""
        raise InvariantError("the sharded scheduler decides inline only (`decide`)")

    def _send_tick(self, i: int, now: float) -> None:
        box, self._out[i] = self._out[i], Outbox()
        self.messages += 1
        try:
            self._shards[i].send(wire_dumps((TICK, now, self._means.since(i), box)))
        except OSError:
            pass  # dead: `_receive` notices and recovers

    def _receive(self, i: int, now: float) -> list[Assignment]:
        while True:
            try:
                reply = wire_loads(self._shards[i].recv())
            except (EOFError, OSError):
                reply = None
            if isinstance(reply, list):
                return self._granted(i, reply, now)
            if isinstance(reply, tuple):
                raise TangramError(f"shard {i} ({self._span(i)}) failed: {reply[1]}")
            if not self._recover(i):
                return []
            self._send_tick(i, now)

    def _granted(self, i: int, reply: list, now: float) -> list[Assignment]:
        self._due.pop(i, None)
        if reply and not isinstance(reply[-1], tuple):  # a put-off class (`ShardWorker.tick`):
            due = reply.pop()  # re-read at the next decision (None) or the first from `due`
            if due is None:
                self._dirty.add(i)
            else:
                self._due[i] = due
        return self._take(i, reply, now)

    def _take(self, i: int, grants: list, now: float) -> list[Assignment]:
        """Shard i's grants at `now`, taken in the router's mirror (which refuses a core
        granted twice) and its running actions."""
        out = []
        queued, running = self._queued[i], self._running[i]
        later = self._untaken if self.defers_grants else None
        for g in grants:
            aid, units, placement = grant_from_wire(g)
            act = queued.pop(aid, None)
            if act is None:
                raise InvariantError(f"shard {i} started {aid!r}, which it does not hold")
            a = assignment(act, units, placement)
            if later is not None:
                # taken in the mirror when it is read (`sync_pools`), its expected end
                # estimated when read (`running`)
                later[aid] = a
                running[aid] = running_action(a, now, _NAN)
            else:
                self._mirror_take(i, aid, units, placement)
                running[aid] = RunningAction(a, now, now + self._estimate_of(a))
            out.append(a)
        self._in_shards -= len(out)
        return out

    def _estimate_of(self, a: Assignment) -> float:
        key = a.action.key
        return self.estimate(a.action, a.units[key] if key else None)

    def _mirror_take(self, i: int, aid: str, units: dict, placement: dict) -> None:
        for r, u in units.items():  # the mirror refuses a core granted twice
            try:
                self.pools[r].take(placement[r], u)
            except Exception as exc:
                raise InvariantError(f"shard {i}: action {aid}: {r}: {exc}") from exc

    def sync_pools(self) -> None:
        """Take every grant not taken yet in the router's mirror of the core pools (batched:
        a grant that ends before anything reads the mirror is never taken nor released)."""
        untaken, self._untaken = self._untaken, {}
        for aid, a in untaken.items():
            self._mirror_take(self._where[aid], aid, a.units, a.placement)

    def _new_box(self) -> Outbox | Ops:
        return Ops() if self.defers_grants else Outbox()

    # -- batches (the simulator's event loop: `batched=True`) ------------------------------------
    def _decide_later(self, now: float, queued: int, in_global: int) -> list[Assignment]:
        """Note this instant's work for each shard an event touched and decide the global shard
        at once; the node shards answer when the batch is sent (`settle`)."""
        self.decisions += 1
        b = self._batch
        instants = b.instants
        j = len(instants)
        if not j:  # the means as of the batch's first instant; `complete` notes later changes
            b.base = {k: m for k in self._means.kind_at if (m := self.profiles.mean(k)) is not None}
        instants.append(now)
        b.queued.append(queued)
        dirty = self._dirty
        if dirty:
            out = self._out
            for i in dirty:
                out[i].mark(j)
            dirty.clear()
        self.last_instant = b.first_id + j
        if not in_global:
            return []
        got = self._global.decide(now)
        if got:
            b.inline[j] = got
        return got

    def outstanding_since(self) -> float | None:
        """The earliest instant whose node-shard grants the simulator has not collected."""
        b = self._batch
        if b.ready:
            return b.ready[0][1]
        return b.instants[0] if b.instants else None

    def collect(self) -> list[tuple[int, float, list[Assignment]]]:
        """Every node-shard grant not collected yet, as (instant id, time, grants) in order."""
        self.settle()
        out, self._batch.ready = self._batch.ready, []
        return out

    def settle(self) -> None:
        """Send the open batch: one message to each shard with work in it or a due put-off
        class, all sent before any answer is read (the shards decide in parallel)."""
        b = self._batch
        if not b.instants:
            return
        common = wire_dumps((array("d", b.instants), b.base, b.changes.wire()))
        asked = [i for i in range(len(self._shards)) if self._out[i].cut or b.wants(i)]
        for i in asked:
            ops, self._out[i] = self._out[i].split()
            self._send_batch(i, common, ops)
        t0 = time.perf_counter()
        per: dict[int, list[Assignment]] = {}  # instant -> the node shards' grants there
        wire = self.wire_s
        for i in asked:
            results = self._receive_batch(i, common)
            dt = time.perf_counter() - t0
            for k, grants in results:
                got = self._take(i, grants, b.instants[k])
                if k in per:
                    per[k] += got
                else:
                    per[k] = got
                if wire is not None:
                    for a in got:
                        wire[a.action.id] = dt
        self._close_batch(per)

    def _close_batch(self, per: dict[int, list[Assignment]]) -> None:
        """Keep the node shards' grants for `collect` (and log each instant's). An instant at
        which the router counted queued actions that a shard had in truth already started
        in this batch had nothing queued: no decision (as one scheduler makes none). Walks the
        instants with grants, not every instant."""
        b = self._batch
        if self.stream is not None:
            self._log_batch(per)
        queued, done = b.queued, 0
        at = 0  # (read only once `done`: set at the first instant with grants)
        for k in sorted(per):
            got = per[k]
            if not got:
                continue
            if done:  # (before the batch's first grant every count holds; at an instant with
                # grants something was queued beside the `done` already started)
                self.decisions -= _at_most(queued[at:k], done)
            b.ready.append((b.first_id + k, b.instants[k], got))
            done += len(got)
            at = k + 1
        if done:
            self.decisions -= _at_most(queued[at:], done)
        b.close()

    def _log_batch(self, per: dict[int, list[Assignment]]) -> None:
        """Each decision's grants in `stream`, the global shard's and the node shards'."""
        b = self._batch
        done = 0
        for k, now in enumerate(b.instants):
            got = per.get(k, [])
            if b.queued[k] > done:  # (else no decision: `_close_batch`)
                self._log("granted", now, tuple(b.inline.get(k, ())) + tuple(got))
            done += len(got)

    def _send_batch(self, i: int, common: bytes, ticks: list) -> None:
        if i in self._dead:
            return
        self.messages += 1
        try:
            self._shards[i].send(wire_dumps((BATCH, common, ticks)))
        except OSError:
            pass  # dead: `_receive_batch` notices and recovers

    def _receive_batch(self, i: int, common: bytes) -> list:
        """Shard i's answer to the batch: [(instant, grants)]. A dead shard is replaced from
        the router's copies (which hold all the batch's work) and decides at its last instant."""
        b = self._batch
        while i not in self._dead:
            try:
                reply = wire_loads(self._shards[i].recv())
            except (EOFError, OSError):
                reply = None
            if isinstance(reply, tuple) and reply[0] == "error":
                raise TangramError(f"shard {i} ({self._span(i)}) failed: {reply[1]}")
            if reply is not None:
                results, b.wake[i] = reply
                return results
            b.wake[i] = False
            if not self._recover(i):
                break
            self._send_batch(i, common, [len(b.instants) - 1])
        return []

    def _span(self, i: int) -> str:
        g = self.layout.groups[i]
        return f"nodes {g[0]}..{g[-1]}" if len(g) > 1 else f"node {g[0]}"

    def _recover(self, i: int) -> bool:
        """Replace dead shard i from the router's copies; after `max_restarts` fail its queued
        actions naming it. True when a replacement runs."""
        old = self._shards[i]
        exit_code = old.reap()
        self.sync_pools()  # the replacement's nodes as its running actions hold them
        self._out[i] = self._new_box()  # all of it is in the router's copies
        if self.restarts[i] < self.max_restarts:
            self.restarts[i] += 1
            log.warning(
                "shard %d (%s) died (exit %s): restarted with %d running and %d queued actions",
                i,
                self._span(i),
                exit_code,
                len(self._running[i]),
                len(self._queued[i]),
            )
            running = [(ra.assignment, ra.start) for ra in self._running[i].values()]
            self._shards[i] = self._spawn(i, running, list(self._queued[i].values()))
            return True
        err = ShardLost(
            f"shard {i} ({self._span(i)}) died {self.restarts[i] + 1} times "
            f"(exit {exit_code}); its queued actions failed"
        )
        log.error("%s", err)
        for aid in self._queued[i]:
            self.failed[aid] = err
            del self._where[aid]
        self._in_shards -= len(self._queued[i])
        self._queued[i].clear()
        self._dead.add(i)
        return False

    def complete(
        self, action_id: str, now: float, run_s: float | None = None, status: Status = Status.OK
    ) -> RunningAction:
        i = self._where.pop(action_id)
        learn = status in LEARNED or status in CENSORED  # the one learning rule's statuses
        if i == GLOBAL:
            ra = self._global.complete(action_id, now, run_s, status)
            if learn:
                self._learned(ra.assignment.action.kind)
            return ra
        ra = self._running[i].pop(action_id)
        a = ra.assignment
        if self._untaken.pop(action_id, None) is None:
            for r, u in a.units.items():
                self.pools[r].release(a.placement[r], u)
        self._out[i].completes.append(action_id)
        self._dirty.add(i)
        if learn:
            act = a.action
            self.profiles.record(act, a.units, now - ra.start if run_s is None else run_s, status)
            self._learned(act.kind)
        return ra

    def _learned(self, kind: str) -> None:
        """A completion of `kind` was learned from: its mean goes to every shard (per instant,
        with its next tick; batched, as a change before the batch's next instant)."""
        self._means.observed(kind)
        b = self._batch
        if b.instants:  # (before the first, the batch's base reads it)
            m = self.profiles.mean(kind)
            if m is not None:  # an elastic kind learns its curve, not a mean
                b.changes.append(len(b.instants), kind, m)

    def take_failed(self) -> list[tuple[str, ShardLost]]:
        """The actions failed since the last call (a lost shard's queue), to report."""
        out, self.failed = list(self.failed.items()), {}
        return out

    def state(self, i: int) -> tuple[list[str], list[str]]:
        """(queued ids, running ids) as shard i itself holds them (tests)."""
        self.settle()
        s = self._shards[i]
        s.send(wire_dumps((STATE,)))
        return wire_loads(s.recv())

    def _log(self, *event) -> None:
        if self.stream is not None:
            self.stream.append(event)
