"""The scheduler sharded over processes: one shard per group of nodes (docs/scale.md, "Shards").

`ShardedScheduler` answers what `tangram.scheduler.Scheduler` answers (`submit`, `enqueue`,
`cancel`, `decide`, `complete`, `bind`, `unbind`, `validate`), so the simulator and the runtime
drive it unchanged. Behind it:

- **Node shards**, one worker process each (forked, a pipe per shard), each a scoped
  `Scheduler` over its nodes' slice of the core pools: their queue classes, their core state,
  their running actions. A decision on a node is made in its shard, with the inputs the single
  scheduler would have used for that node: the node's queue, its running actions, and the
  learned per-kind durations, which the router mirrors to every shard before it decides.
- **The global shard**: a `Scheduler` in the router's process over the pooled resources (GPU
  chunks, API limits), beside the GPU manager's residency model its decisions consult.
- **The router** (this class) routes an action by its trajectory's bound node
  (`tangram.sharding.ShardLayout`), binds a trajectory's first CPU action to the node the pool
  would place it on (most free cores, first in order), and keeps a mirror of every core pool
  (each grant taken, each completion released, so a shard that grants a taken core is caught).

Liveness and work conservation hold per shard: each shard is the scheduler itself over its
nodes, deciding on every event that touches them. A shard that dies loses no queued action: the
router holds a copy of every queued and running action, forks a replacement built from the
mirror (running actions adopted, queued ones resubmitted in their order) and asks it again;
after `max_restarts` failures of one shard its queued actions fail with `ShardLost` naming it.
Worker processes die with the router (`PR_SET_PDEATHSIG`), even when it is killed.
"""

from __future__ import annotations

import copyreg
import ctypes
import dataclasses
import gc
import io
import logging
import multiprocessing
import os
import pickle
import signal
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from tangram.actions import Action, Elasticity
from tangram.allocation import Allocator, Assignment, RunningAction
from tangram.errors import Infeasible, InvariantError, QueueFull, TangramError, ValidationError
from tangram.pools import CorePool, Placement, Pool
from tangram.profiles import CENSORED, LEARNED, DurationProfiles
from tangram.resources import Demand
from tangram.results import Status
from tangram.scheduler import DEFAULT_MAX_QUEUE, Scheduler
from tangram.sharding import GLOBAL, ShardLayout

log = logging.getLogger("tangram.shards")



# -- the wire: actions go to shards, grants come back, pickled with the reducers below (for
# this pipe only: other pickling of these types is untouched). They send what a value is made
# of and rebuild it without the dataclass machinery (`fields()` on every object) and without
# validating again what the router validated. An action's payload stays in the router: a
# shard decides, it never runs anything.
# every field of `Action` but those rebuilt here (so a new field crosses the pipe unasked)
_ACTION_FIELDS = tuple(f.name for f in dataclasses.fields(Action)
                       if f.name not in ("demands", "mins", "payload", "option_arrays"))
assert _ACTION_FIELDS[0] == "id" and _ACTION_FIELDS[1] == "elasticity"  # `_reduce_action`


def _read_only(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


def _action(demands: dict, mins: dict, values: tuple) -> Action:
    a = object.__new__(Action)
    put = object.__setattr__
    put(a, "demands", MappingProxyType(demands))
    put(a, "mins", MappingProxyType(mins))
    put(a, "payload", None)
    for name, v in zip(_ACTION_FIELDS, values):
        put(a, name, v)
    options = a.options
    put(a, "option_arrays", (np.array([m for m, _ in options], dtype=np.int64),
                             np.array([d for _, d in options], dtype=np.float64))
        if options else None)
    return a


def _reduce_action(a: Action):
    values = tuple(getattr(a, name) for name in _ACTION_FIELDS)
    el = a.elasticity
    if el is not None and not isinstance(el.efficiency, Mapping):
        # E(m) as a function (a learned fit's closure) goes as its table over the allowed
        # amounts, the only ones a decision or a completion reads
        table = MappingProxyType({m: el.e(m) for m in a.demands[el.key].amounts})
        values = (values[0], _elasticity(el.key, el.t_ori, table)) + values[2:]
    return _action, (dict(a.demands), dict(a.mins), values)


def _elasticity(key: str, t_ori: float, efficiency) -> Elasticity:
    e = object.__new__(Elasticity)
    object.__setattr__(e, "key", key)
    object.__setattr__(e, "t_ori", t_ori)
    object.__setattr__(e, "efficiency", efficiency)
    return e


_WIRE = {**copyreg.dispatch_table,
         MappingProxyType: lambda m: (_read_only, (dict(m),)),
         Action: _reduce_action,
         Elasticity: lambda e: (_elasticity, (e.key, e.t_ori, e.efficiency)),
         Demand: lambda d: (Demand, (d.amounts,)),
         Placement: lambda p: (Placement, (p.node, p.cores, p.chunk))}


def wire_dumps(msg: Any) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _WIRE
    p.dump(msg)
    return buf.getvalue()


def _send(conn, msg) -> None:
    conn.send_bytes(wire_dumps(msg))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


_PR_SET_PDEATHSIG = 1
TICK, STATE, STOP = "tick", "state", "stop"
PENDING = -2  # `_where` of an action waiting for its trajectory's node


class QueueView:
    """The queued actions of every shard, read-only, as `ActionQueue` reads: in arrival order
    per shard when iterated, by id through `keys`, `values`, `items`, `get` and `in`."""

    def __init__(self, actions: dict[str, Action]) -> None:
        self._all = actions

    def __len__(self) -> int:
        return len(self._all)

    def __bool__(self) -> bool:
        return bool(self._all)

    def __iter__(self):
        return iter(self._all.values())

    def __contains__(self, item: object) -> bool:
        return (self._all.get(item.id) is item) if isinstance(item, Action) else item in self._all

    def get(self, action_id: str) -> Action | None:
        return self._all.get(action_id)

    def keys(self):
        return self._all.keys()

    def values(self):
        return self._all.values()

    def items(self):
        return self._all.items()


class ShardLost(TangramError):
    """A shard process died and could not be replaced: its queued actions fail with this."""


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


class _ShardScheduler(Scheduler):
    def adopt(self, a: Assignment, start: float) -> None:
        """Take over an action a dead shard had started: its units are taken in the pools this
        shard was built from, so they are released first and taken back through `_start`."""
        for r, u in a.units.items():
            self.pools[r].release(a.placement[r], u)
        self.enqueue(a.action)
        self._start(a, start)


@dataclass
class _Outbox:
    """What a shard has not been told yet, in the order it must apply it."""

    unbinds: list[str] = field(default_factory=list)
    binds: list[tuple[str, str, str]] = field(default_factory=list)
    completes: list[str] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    arrivals: list[Action] = field(default_factory=list)


def _shard_main(conn, parent: int, inherited: list, pools: dict[str, Pool], allocator: Allocator,
                default: float, means: dict[str, float], bindings: list, running: list,
                queued: list[Action]) -> None:
    """One shard's loop: apply what the router sends, decide, answer the grants."""
    die_with_parent(parent)
    for c in inherited:  # the other shards' pipe ends, copied by fork
        c.close()
    gc.enable()
    sched = _ShardScheduler(pools, allocator, profiles=MirroredProfiles(default, means),
                            scoped=True)
    profiles = sched.profiles
    for (t, r), n in bindings:
        sched.bind(t, r, n)
    for a, start in running:
        sched.adopt(a, start)
    for act in queued:
        sched.enqueue(act)
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return
        op = msg[0]
        try:
            if op == TICK:
                _, now, mean_updates, box = msg
                profiles.means.update(mean_updates)
                for t in box.unbinds:
                    sched.unbind(t)
                for t, r, n in box.binds:
                    sched.bind(t, r, n)
                for aid in box.completes:
                    sched.complete(aid, now, status=Status.CANCELLED)  # the router learns
                for aid in box.cancels:
                    sched.cancel(aid)
                for act in box.arrivals:
                    sched.enqueue(act)
                out = sched.decide(now)
                grants: list = [(a.action.id, dict(a.units), dict(a.placement)) for a in out]
                if sched.wants_next_decision():
                    grants.append(None)  # re-read at the router's next decision (`_granted`)
                _send(conn, grants)
            elif op == STATE:
                _send(conn, (list(sched.queue.keys()), sorted(sched.running)))
            else:
                _send(conn, None)
                return
        except Exception as exc:  # the router names the shard and fails loudly
            _send(conn, ("error", f"{type(exc).__name__}: {exc}"))
            return


@dataclass
class _Shard:
    index: int
    nodes: tuple[str, ...]
    process: Any
    conn: Any


class ShardedScheduler:
    """The scheduler's interface over `shards` node shards plus the global shard (module
    docstring). Node shards always decide scoped (a shard decides what an event touched)."""

    def __init__(self, pools: Mapping[str, Pool], allocator: Allocator, *, shards: int,
                 profiles: DurationProfiles | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
                 scoped: bool = True, max_restarts: int = 3, log_stream: bool = False) -> None:
        self.pools = dict(pools)
        self.allocator = allocator
        sharded = [r for r, p in self.pools.items() if isinstance(p, CorePool)]
        nodes = list(dict.fromkeys(n for r in sharded for n in self.pools[r].nodes()))
        # no core pool (a GPU-only cluster): everything is the global shard's
        self.layout = (ShardLayout.contiguous(sharded, nodes, shards) if sharded
                       else ShardLayout((), ()))
        shards = len(self.layout.groups)
        # the global shard: every pooled resource, in this process (scoped as asked)
        self._global = Scheduler(self.pools, allocator, profiles=profiles, max_queue=max_queue,
                                 scoped=scoped)
        self.profiles = self._global.profiles
        self.bindings = self._global.bindings  # one binding table: the router's
        self.max_queue = max_queue
        self.max_restarts = max_restarts
        self.decisions = 0
        self.restarts = [0] * shards
        self.failed: dict[str, ShardLost] = {}  # action id -> why it failed
        self.last_scope = None
        self._where: dict[str, int] = {}  # queued or running action -> shard (GLOBAL, PENDING)
        self._queued: list[dict[str, Action]] = [{} for _ in range(shards)]
        self._running: list[dict[str, RunningAction]] = [{} for _ in range(shards)]
        self._pending: deque[Action] = deque()  # first CPU actions of unbound trajectories
        self._out = [_Outbox() for _ in range(shards)]
        self._dirty: set[int] = set()
        self._dead: set[int] = set()
        self._kind_at: dict[str, int] = {}  # kind -> version of its last observation
        self._version = 0
        self._sent = [0] * shards  # the version each shard's means are at
        self.stream: list[tuple] | None = [] if log_stream else None
        self._shards: list[_Shard] = []
        for i in range(shards):
            self._shards.append(self._spawn(i, [], []))

    # -- processes --------------------------------------------------------------------------------
    def _spawn(self, i: int, running: list, queued: list[Action]) -> _Shard:
        nodes = self.layout.groups[i]
        mine = set(nodes)
        pools = {}
        for r in self.layout.resources:
            pool = self.pools[r]
            have = set(pool.nodes())
            pools[r] = CorePool(r, {n: pool.cpu_node(n) for n in nodes if n in have})
        bindings = [(k, n) for k, n in self.bindings.items() if n in mine]
        means = {k: m for k in self._kind_at if (m := self.profiles.mean(k)) is not None}
        ctx = multiprocessing.get_context("fork")
        ours, theirs = ctx.Pipe()
        others = [s.conn for s in self._shards if s.index != i]
        p = ctx.Process(target=_shard_main, name=f"tangram-shard-{i}", daemon=True,
                        args=(theirs, os.getpid(), others, pools, self.allocator,
                              self.profiles.default, means, bindings, running, queued))
        gc.freeze()  # the child's collector leaves the router's heap alone (no copy on write)
        try:
            p.start()
        finally:
            gc.unfreeze()
        theirs.close()
        self._sent[i] = self._version
        return _Shard(i, nodes, p, ours)

    def describe(self) -> str:
        """The layout in one line: shards, nodes per shard, the global shard's resources."""
        sizes = sorted({len(g) for g in self.layout.groups})
        pooled = sorted(set(self.pools) - set(self.layout.resources))
        return (f"{len(self.layout.groups)} node shards x {'-'.join(map(str, sizes))} nodes "
                f"({', '.join(self.layout.resources)}), each a process; global shard "
                f"(in the router): {', '.join(pooled) or 'nothing pooled'}")

    def shard_pids(self) -> list[int]:
        return [s.process.pid for s in self._shards]

    def shard_cpu_s(self) -> list[float]:
        """Each node shard's own CPU seconds so far, read from /proc (0 for a dead one)."""
        out = []
        for s in self._shards:
            try:
                out.append(process_cpu_s(s.process.pid))
            except (OSError, IndexError):
                out.append(0.0)
        return out

    def close(self) -> None:
        for s in self._shards:
            try:
                _send(s.conn, (STOP,))
            except OSError:
                pass
        for s in self._shards:
            s.process.join(timeout=5)
            if s.process.is_alive():
                s.process.kill()
                s.process.join()
            s.conn.close()

    def __enter__(self) -> ShardedScheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- admission --------------------------------------------------------------------------------
    @property
    def queue(self) -> QueueView:
        """Every queued action (the global shard's, the pending, each node shard's)."""
        out = dict(self._global.queue.items())
        out.update((a.id, a) for a in self._pending)
        for q in self._queued:
            out.update(q)
        return QueueView(out)

    @property
    def running(self) -> dict[str, RunningAction]:
        """Every running action by id, as the router holds them."""
        out = dict(self._global.running)
        for r in self._running:
            out.update(r)
        return out

    def queued(self) -> int:
        return len(self._global.queue) + len(self._pending) + sum(map(len, self._queued))

    def validate(self, action: Action) -> None:
        self._global.validate(action)
        self.layout.route(action, self.bindings)  # refuses a demand no shard can decide

    def node_of(self, action: Action, resource: str) -> str | None:
        return self._global.node_of(action, resource)

    def submit(self, action: Action) -> None:
        if action.id in self._where:
            raise ValidationError("action.id", action.id, "already queued or running")
        if self.queued() >= self.max_queue:
            raise QueueFull(f"the queue holds its maximum of {self.max_queue} actions; "
                            "retry later")
        self.validate(action)
        self.enqueue(action)

    def enqueue(self, action: Action) -> None:
        i = self.layout.route(action, self.bindings)
        if i is None or (self._pending and i != GLOBAL):
            # no node yet, or behind one that has none: FCFS on the cores, as one scheduler
            self._where[action.id] = PENDING
            self._pending.append(action)
            return
        if i == GLOBAL:
            self._where[action.id] = GLOBAL
            self._global.enqueue(action)
            self._log("enqueue", action)
            return
        self._to_shard(i, action)

    def _to_shard(self, i: int, action: Action) -> None:
        if i in self._dead:
            raise ShardLost(f"action {action.id}: shard {i} ({self._span(i)}) is lost")
        self._where[action.id] = i
        self._queued[i][action.id] = action
        self._out[i].arrivals.append(action)
        self._dirty.add(i)
        self._log("enqueue", action)

    def cancel(self, action_id: str) -> bool:
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
                self._out[i].cancels.append(action_id)
                self._dirty.add(i)
        if ok:
            del self._where[action_id]
            self._log("cancel", action_id)
        return ok

    def bind(self, trajectory: str, resource: str, node: str) -> None:
        if self.bindings.get((trajectory, resource)) == node:
            return
        self._global.bind(trajectory, resource, node)
        if resource in self.layout.resources:
            self._out[self.layout.shard_of(node)].binds.append((trajectory, resource, node))
        self._log("bind", trajectory, resource, node)

    def unbind(self, trajectory: str) -> None:
        for r in self.layout.resources:
            node = self.bindings.get((trajectory, r))
            if node is not None:
                self._out[self.layout.shard_of(node)].unbinds.append(trajectory)
        self._global.unbind(trajectory)
        self._log("unbind", trajectory)

    # -- decisions ----------------------------------------------------------------------------
    def estimate(self, action: Action, units: int | None = None) -> float:
        return self.profiles.estimate(action, units)

    def decide(self, now: float) -> list[Assignment]:
        """Bind waiting first actions, ask every shard that an event touched (in parallel), the
        global shard meanwhile, and gather the grants."""
        if not self.queued():
            return []
        self.decisions += 1
        if self._pending:
            self._place_pending()
        self._log("decide", now)
        asked = [i for i in sorted(self._dirty) if self._queued[i]]
        self._dirty.difference_update(asked)
        for i in asked:
            self._send_tick(i, now)
        out = self._global.decide(now)
        for i in asked:
            out.extend(self._receive(i, now))
        self._log("granted", now, tuple(out))
        return out

    def _place_pending(self) -> None:
        """Route the actions waiting for a node, in arrival order, as the FCFS scan would see
        them: a trajectory's first CPU action goes to the node with the most free units that
        holds it (not counting what the shards still queue), a bound one to its shard; the
        first unbound one that fits nowhere blocks every one behind it, bound or not."""
        scratch = {r: self.pools[r].copy() for r in self.layout.resources}
        blocked: dict[str, set[str]] = {}
        while self._pending:
            act = self._pending[0]
            i = self.layout.route(act, self.bindings)
            if i is not None:  # bound: its shard decides; it holds its node for those behind
                for r, k in act.mins.items():
                    node = self.bindings[(act.trajectory, r)]
                    if node in blocked.get(r, ()) or scratch[r].fits(k, node) is None:
                        blocked.setdefault(r, set()).add(node)
                    else:
                        scratch[r].place(k, node)
            else:
                nodes = {}
                for r, k in act.mins.items():
                    try:
                        nodes[r] = scratch[r].place(k, None, blocked.get(r, ())).node
                    except Infeasible:
                        return
                if act.trajectory is not None:  # else the shard places it on any of its nodes
                    for r, n in nodes.items():
                        self.bind(act.trajectory, r, n)
                i = self.layout.shard_of(next(iter(nodes.values())))
            self._pending.popleft()
            self._to_shard(i, act)

    def _means_for(self, i: int) -> dict[str, float]:
        sent = self._sent[i]
        self._sent[i] = self._version
        if sent == self._version:
            return {}
        return {k: m for k, v in self._kind_at.items()
                if v > sent and (m := self.profiles.mean(k)) is not None}

    def _send_tick(self, i: int, now: float) -> None:
        box, self._out[i] = self._out[i], _Outbox()
        try:
            _send(self._shards[i].conn, (TICK, now, self._means_for(i), box))
        except OSError:
            pass  # dead: `_receive` notices and recovers

    def _receive(self, i: int, now: float) -> list[Assignment]:
        while True:
            try:
                reply = _recv(self._shards[i].conn)
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
        out = []
        queued, running = self._queued[i], self._running[i]
        if reply and reply[-1] is None:  # a put-off class, re-read at every decision as the
            reply.pop()                  # one-process scoped scheduler does
            self._dirty.add(i)
        for aid, units, placement in reply:
            act = queued.pop(aid, None)
            if act is None:
                raise InvariantError(f"shard {i} started {aid!r}, which it does not hold")
            a = Assignment(act, units, placement)
            for r, u in units.items():  # the mirror refuses a core granted twice
                try:
                    self.pools[r].take(placement[r], u)
                except Exception as exc:
                    raise InvariantError(f"shard {i}: action {aid}: {r}: {exc}") from exc
            key = act.key
            running[aid] = RunningAction(a, now, now + self.estimate(
                act, units[key] if key else None))
            out.append(a)
        return out

    def _span(self, i: int) -> str:
        g = self.layout.groups[i]
        return f"nodes {g[0]}..{g[-1]}" if len(g) > 1 else f"node {g[0]}"

    def _recover(self, i: int) -> bool:
        """Replace dead shard i from the router's copies; after `max_restarts` fail its queued
        actions naming it. True when a replacement runs."""
        old = self._shards[i]
        old.process.join(timeout=1)
        if old.process.is_alive():
            old.process.kill()
            old.process.join()
        old.conn.close()
        self._out[i] = _Outbox()  # all of it is in the router's copies
        if self.restarts[i] < self.max_restarts:
            self.restarts[i] += 1
            log.warning("shard %d (%s) died (exit %s): restarted with %d running and %d queued "
                        "actions", i, self._span(i), old.process.exitcode, len(self._running[i]),
                        len(self._queued[i]))
            running = [(ra.assignment, ra.start) for ra in self._running[i].values()]
            self._shards[i] = self._spawn(i, running, list(self._queued[i].values()))
            return True
        err = ShardLost(f"shard {i} ({self._span(i)}) died {self.restarts[i] + 1} times "
                        f"(exit {old.process.exitcode}); its queued actions failed")
        log.error("%s", err)
        for aid in self._queued[i]:
            self.failed[aid] = err
            del self._where[aid]
        self._queued[i].clear()
        self._dead.add(i)
        return False

    def complete(self, action_id: str, now: float, run_s: float | None = None,
                 status: Status = Status.OK) -> RunningAction:
        i = self._where.pop(action_id)
        learn = status in LEARNED or status in CENSORED  # the one learning rule's statuses
        if i == GLOBAL:
            ra = self._global.complete(action_id, now, run_s, status)
        else:
            ra = self._running[i].pop(action_id)
            a = ra.assignment
            for r, u in a.units.items():
                self.pools[r].release(a.placement[r], u)
            self._out[i].completes.append(action_id)
            self._dirty.add(i)
            if learn:
                self.profiles.record(a.action, dict(a.units),
                                     now - ra.start if run_s is None else run_s, status)
        if learn:
            self._version += 1
            self._kind_at[ra.assignment.action.kind] = self._version
        self._log("complete", action_id, now, run_s, status)
        return ra

    def take_failed(self) -> list[tuple[str, ShardLost]]:
        """The actions failed since the last call (a lost shard's queue), to report."""
        out = list(self.failed.items())
        self.failed.clear()
        return out

    def state(self, i: int) -> tuple[list[str], list[str]]:
        """(queued ids, running ids) as shard i itself holds them (tests)."""
        s = self._shards[i]
        _send(s.conn, (STATE,))
        return _recv(s.conn)

    def _log(self, *event) -> None:
        if self.stream is not None:
            self.stream.append(event)
