"""The residency cache of a GPU pool (paper 5.3): which service variants sit in GPU memory.

Pure pool logic, shared by the simulator and the real manager. An *entry* is one variant of a
service resident on one aligned chunk: it holds `bytes_per_gpu` on every GPU of that chunk.
Per GPU the cache keeps memory accounting (never above the GPU's memory) and who runs there (at
most one action per GPU). When an action starts (`begin`):

- if its variant is resident on exactly its chunk, it runs at once (a *hit*);
- else the variant is restored from the host copy; first, on each GPU of the chunk, resident
  entries are evicted (least recently used first, by default) until the variant fits. Eviction
  frees the entry on all its GPUs and writes nothing back (the host copy is kept).

A command granted GPUs that is no service (a vector exec's sandbox) `hold`s its chunk instead:
every entry on its GPUs is evicted first, and nothing is restored there until its `end`.

The service stays resident after the action (`end` stamps its last use). `prefer` scores chunk
choices for the placement policy (`ResidencyAdvisor.prefer`, the pool's advisor, in
`managers.gpu.advisor`): the chunk where the variant is resident wins, then a chunk where it
fits without evicting anything, then the chunk whose victims were used longest ago. Every
mutation re-checks the invariants and raises `InvariantError` rather than continue from a
broken state.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from managers.gpu.services import RestoreModel, Service, ServiceRegistry
from tangram.actions import Action
from tangram.errors import InvariantError, ValidationError
from topology import is_aligned

Chunk = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Entry:
    """One resident variant: `service` on `chunk` of `node`, `bytes_per_gpu` on each GPU."""

    service: str
    node: str
    chunk: Chunk
    bytes_per_gpu: int

    @property
    def gpus(self) -> range:
        return range(*self.chunk)


@dataclass(frozen=True, slots=True)
class RestoreDecision:
    """What `begin` decided: restore or not, how long it takes, and which entries it evicted."""

    service: str
    node: str
    chunk: Chunk
    restored: bool
    restore_s: float
    restore_bytes: int = 0
    evicted: tuple[Entry, ...] = ()


@dataclass(slots=True)
class _Gpu:
    memory: int
    used: int = 0
    busy: str | None = None  # the action running here
    entries: set[Entry] = field(default_factory=set)


class EvictionOrder:
    """Which resident entry to evict next among candidates; the default is least recently used."""

    name = "lru"

    def pick(
        self, candidates: Sequence[Entry], last_use: Mapping[Entry, tuple[float, int]]
    ) -> Entry:
        return min(candidates, key=lambda e: (last_use[e], e.service, e.chunk))


class RandomEviction(EvictionOrder):
    """A baseline: evict a uniformly random resident entry (seeded, so runs repeat)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def pick(self, candidates, last_use):
        return self._rng.choice(sorted(candidates, key=lambda e: (e.service, e.chunk)))


class Residency:
    """Residency, memory and occupancy of every GPU of a chunk pool (one resource).

    `memory[node]` lists each GPU's memory in bytes. Services come from `registry`; every
    variant must fit an empty GPU of every node, checked here and at `register`.
    """

    def __init__(
        self,
        memory: Mapping[str, Sequence[int]],
        registry: ServiceRegistry,
        resource: str = "gpu",
        restore: RestoreModel | None = None,
        eviction: EvictionOrder | None = None,
        check: bool = True,
    ) -> None:
        self.resource = resource
        self.registry = registry
        self.restore = restore or RestoreModel()
        self.eviction = eviction or EvictionOrder()
        self.check = check
        self._gpus: dict[str, list[_Gpu]] = {}
        for node, mems in memory.items():
            for i, m in enumerate(mems):
                if isinstance(m, bool) or not isinstance(m, int) or m <= 0:
                    raise ValidationError(
                        f"{resource}.{node}.gpu{i}.memory_bytes", m, "must be a positive integer"
                    )
            self._gpus[node] = [_Gpu(m) for m in mems]
        self._entries: dict[tuple[str, str, Chunk], Entry] = {}
        self._last_use: dict[Entry, tuple[float, int]] = {}
        self._running: dict[str, tuple[str, Chunk]] = {}  # action id -> (node, chunk)
        self._tick = 0
        for s in registry:
            self._check_fits(s)

    @classmethod
    def uniform(
        cls, nodes: Mapping[str, int], memory_bytes: int, registry: ServiceRegistry, **kw
    ) -> Residency:
        """Every node has `nodes[n]` GPUs of `memory_bytes` each."""
        return cls({n: [memory_bytes] * g for n, g in nodes.items()}, registry, **kw)

    # -- registry --------------------------------------------------------------------------
    def register(self, service: Service) -> Service:
        self._check_fits(service)
        return self.registry.register(service)

    def _check_fits(self, service: Service) -> None:
        for node, gpus in self._gpus.items():
            smallest = min((g.memory for g in gpus), default=0)
            for k in service.dops:
                if k <= len(gpus) and service.bytes_per_gpu(k) > smallest:
                    raise ValidationError(
                        f"services.{service.name}.memory_bytes[{k}]",
                        service.bytes_per_gpu(k),
                        f"exceeds the smallest GPU of {self.resource}.{node} ({smallest} bytes)",
                    )

    # -- reads -----------------------------------------------------------------------------
    def nodes(self) -> list[str]:
        return list(self._gpus)

    def num_gpus(self, node: str) -> int:
        return len(self._gpus[node])

    def used_bytes(self, node: str, gpu: int) -> int:
        return self._gpus[node][gpu].used

    def memory_bytes(self, node: str, gpu: int) -> int:
        return self._gpus[node][gpu].memory

    def busy(self, node: str, gpu: int) -> str | None:
        return self._gpus[node][gpu].busy

    def entries(self, node: str | None = None) -> list[Entry]:
        return [e for e in self._entries.values() if node is None or e.node == node]

    def is_resident(self, service: str, node: str, chunk: Chunk) -> bool:
        return (service, node, (int(chunk[0]), int(chunk[1]))) in self._entries

    def last_use(self, entry: Entry) -> float:
        return self._last_use[entry][0]

    # -- placement preference -------------------------------------------------------------
    def prefer(self, action: Action, resource: str, node: str, chunk: Chunk) -> float:
        """Score a chunk for `action` (`ResidencyAdvisor.prefer`; higher is better).

        2: its service variant is resident on exactly this chunk (no restore);
        1: it fits the free memory of every GPU of the chunk (a restore, but no eviction);
        in (-1, 0]: it needs evictions; the longer ago the most recent victim was used, the
        higher. Actions without a service, and other resources, score 0.
        """
        if resource != self.resource or action.service is None or node not in self._gpus:
            return 0.0
        chunk = (int(chunk[0]), int(chunk[1]))
        if (action.service, node, chunk) in self._entries:
            return 2.0
        service = self.registry.get(action.service)
        need = service.bytes_per_gpu(chunk[1] - chunk[0])
        gpus = self._gpus[node]
        if all(gpus[g].memory - gpus[g].used >= need for g in range(*chunk)):
            return 1.0
        victims = self._plan_evictions(node, chunk, need)
        newest = max((self._last_use[e][1] for e in victims), default=0)
        return -newest / (self._tick + 1)

    def vacancy(self, node: str, chunk: Chunk) -> float:
        """Score a chunk for a command that is no service (a vector exec holds its chunk and
        evicts what is there, `hold`): 1 when nothing is resident on its GPUs; in (-1, 0]
        otherwise, the longer ago the most recently used of those entries, the higher."""
        gpus = self._gpus[node]
        entries = {e for g in range(int(chunk[0]), int(chunk[1])) for e in gpus[g].entries}
        if not entries:
            return 1.0
        return -max(self._last_use[e][1] for e in entries) / (self._tick + 1)

    def should_wait(
        self,
        action: Action,
        resource: str,
        node: str,
        chunk: Chunk,
        busy: Iterable[tuple[str, Chunk, float]],
        now: float,
        claimed: dict[tuple[str, Chunk], int] | None = None,
        infer_s: float | None = None,
    ) -> bool:
        """True when starting `action` on `chunk` would restore its service although a copy of
        the same variant is resident on a busy chunk that frees sooner than the restore would
        take (`busy`: node, chunk and expected end of the running actions). Waiting for that
        copy is then faster and evicts nothing.

        `claimed` counts the actions of this decision already waiting for each copy: the j-th
        waiter also waits for the j inferences before it (`infer_s` each; default: the
        service's profile), so copies do not gather convoys."""
        if resource != self.resource or action.service is None:
            return False
        chunk = (int(chunk[0]), int(chunk[1]))
        if (action.service, node, chunk) in self._entries:
            return False
        k = chunk[1] - chunk[0]
        service = self.registry.get(action.service)
        restore_s = service.restore_seconds(k, self.restore)
        if infer_s is None:
            infer_s = service.infer_seconds(k)
        for n, c, end in busy:
            c = (int(c[0]), int(c[1]))
            if c[1] - c[0] != k or (action.service, n, c) not in self._entries:
                continue
            ahead = claimed.get((n, c), 0) if claimed is not None else 0
            if end - now + ahead * infer_s < restore_s:
                if claimed is not None:
                    claimed[(n, c)] = ahead + 1
                return True
        return False

    # -- mutations -------------------------------------------------------------------------
    def begin(self, action: Action, node: str, chunk: Chunk, now: float) -> RestoreDecision:
        """Start `action` (which names a service) on `chunk` of `node` at time `now`.

        Marks the chunk's GPUs busy; on a miss evicts (the eviction order's choice first) until
        the variant fits on every GPU, then records it resident. Raises `InvariantError` when a
        GPU of the chunk already runs an action or memory would overflow.
        """
        chunk = self._checked_chunk(node, chunk)
        service = self.registry.get(action.service)
        need = service.bytes_per_gpu(chunk[1] - chunk[0])
        gpus = self._gpus[node]
        self._occupy(action, node, chunk)
        key = (service.name, node, chunk)
        hit = self._entries.get(key)
        if hit is not None:
            self._last_use[hit] = (now, self._tick)
            self._verify()
            return RestoreDecision(service.name, node, chunk, False, 0.0)
        evicted = self._plan_evictions(node, chunk, need)
        for e in evicted:
            self._drop(e)
        entry = Entry(service.name, node, chunk, need)
        for g in range(*chunk):
            gpus[g].used += need
            gpus[g].entries.add(entry)
            if gpus[g].used > gpus[g].memory:
                raise InvariantError(
                    f"{self.resource}.{node}.gpu{g}: {gpus[g].used} bytes "
                    f"resident, over its {gpus[g].memory}"
                )
        self._entries[key] = entry
        self._last_use[entry] = (now, self._tick)
        self._verify()
        return RestoreDecision(
            service.name,
            node,
            chunk,
            True,
            service.restore_seconds(chunk[1] - chunk[0], self.restore),
            need,
            tuple(evicted),
        )

    def hold(self, action: Action, node: str, chunk: Chunk, now: float) -> tuple[Entry, ...]:
        """Start `action`, a command that is no service (a vector exec's sandbox), on `chunk`
        of `node` at `now`: its GPUs are busy until `end`, so no service is restored onto them
        meanwhile (`begin` refuses a busy GPU), and every entry resident on any of them is
        evicted now, whole (evict-on-execution: the command gets the GPUs' memory). Returns the
        evicted entries, for the backend to free."""
        chunk = self._checked_chunk(node, chunk)
        self._occupy(action, node, chunk)
        gpus = self._gpus[node]
        victims = sorted(
            {e for g in range(*chunk) for e in gpus[g].entries}, key=lambda e: (e.chunk, e.service)
        )
        for e in victims:
            self._drop(e)
        self._verify()
        return tuple(victims)

    def end(self, action: Action, node: str, chunk: Chunk, now: float) -> None:
        """`action` finished: free its GPUs and stamp its service's last use with `now`."""
        chunk = self._checked_chunk(node, chunk)
        if self._running.get(action.id) != (node, chunk):
            raise InvariantError(
                f"{self.resource}: action {action.id} is not running on "
                f"{node}{chunk} (running: {self._running.get(action.id)})"
            )
        del self._running[action.id]
        for g in range(*chunk):
            self._gpus[node][g].busy = None
        entry = self._entries.get((action.service or "", node, chunk))
        if entry is not None:
            self._tick += 1
            self._last_use[entry] = (now, self._tick)
        self._verify()

    def forget(self, service: str, node: str, chunk: Chunk) -> None:
        """Drop a resident entry without a decision (its restore failed, its server died)."""
        entry = self._entries.get((service, node, (int(chunk[0]), int(chunk[1]))))
        if entry is not None:
            self._drop(entry)
            self._verify()

    def forget_node(self, node: str) -> int:
        """Drop every resident entry of a node that died (its GPUs' memory went with it), so
        no placement prefers it; returns how many were dropped."""
        gone = [e for e in self._entries.values() if e.node == node]
        for entry in gone:
            self._drop(entry)
        self._verify()
        return len(gone)

    # -- internals -------------------------------------------------------------------------
    def _occupy(self, action: Action, node: str, chunk: Chunk) -> None:
        """Mark `chunk`'s GPUs busy with `action`; `InvariantError` if one already runs one."""
        gpus = self._gpus[node]
        if action.id in self._running:
            raise InvariantError(
                f"{self.resource}: action {action.id} is already running on "
                f"{self._running[action.id]}"
            )
        for g in range(*chunk):
            if gpus[g].busy is not None:
                raise InvariantError(
                    f"{self.resource}.{node}.gpu{g}: runs {gpus[g].busy}, "
                    f"cannot also run {action.id}"
                )
        for g in range(*chunk):
            gpus[g].busy = action.id
        self._running[action.id] = (node, chunk)
        self._tick += 1

    def _checked_chunk(self, node: str, chunk: Chunk) -> Chunk:
        if node not in self._gpus:
            raise InvariantError(f"{self.resource}: no node {node!r} (nodes: {self.nodes()})")
        s, e = int(chunk[0]), int(chunk[1])
        if not is_aligned((s, e), len(self._gpus[node])):
            raise InvariantError(f"{self.resource}.{node}: {chunk} is not an aligned chunk")
        return (s, e)

    def _plan_evictions(self, node: str, chunk: Chunk, need: int) -> list[Entry]:
        """Entries to evict, in order, until `need` bytes are free on every GPU of the chunk."""
        gpus = self._gpus[node]
        freed: dict[int, int] = {}
        victims: list[Entry] = []
        for g in range(*chunk):
            while gpus[g].memory - gpus[g].used + freed.get(g, 0) < need:
                candidates = [e for e in gpus[g].entries if e not in victims]
                if not candidates:
                    raise InvariantError(
                        f"{self.resource}.{node}.gpu{g}: {need} bytes cannot "
                        f"fit its {gpus[g].memory} even when empty"
                    )
                victim = self.eviction.pick(candidates, self._last_use)
                victims.append(victim)
                for vg in victim.gpus:
                    freed[vg] = freed.get(vg, 0) + victim.bytes_per_gpu
        return victims

    def _drop(self, entry: Entry) -> None:
        gpus = self._gpus[entry.node]
        for g in entry.gpus:
            gpus[g].entries.discard(entry)
            gpus[g].used -= entry.bytes_per_gpu
        del self._entries[(entry.service, entry.node, entry.chunk)]
        del self._last_use[entry]

    def _verify(self) -> None:
        if self.check:
            self.verify()

    def verify(self) -> None:
        """Memory sums match the entries and stay within each GPU; busy GPUs match the
        running actions; a running action's GPUs all name it."""
        for node, gpus in self._gpus.items():
            for g, gpu in enumerate(gpus):
                total = sum(e.bytes_per_gpu for e in gpu.entries)
                if total != gpu.used or not 0 <= gpu.used <= gpu.memory:
                    raise InvariantError(
                        f"{self.resource}.{node}.gpu{g}: used {gpu.used}, "
                        f"entries hold {total}, memory {gpu.memory}"
                    )
                if gpu.busy is not None and self._running.get(gpu.busy, (None,))[0] != node:
                    raise InvariantError(
                        f"{self.resource}.{node}.gpu{g}: busy with "
                        f"{gpu.busy}, which is not running here"
                    )
        for aid, (node, chunk) in self._running.items():
            for g in range(*chunk):
                if self._gpus[node][g].busy != aid:
                    raise InvariantError(f"{self.resource}.{node}.gpu{g}: should run {aid}")
        for e in self._entries.values():
            for g in e.gpus:
                if e not in self._gpus[e.node][g].entries:
                    raise InvariantError(f"{self.resource}.{e.node}.gpu{g}: entry {e} missing")
