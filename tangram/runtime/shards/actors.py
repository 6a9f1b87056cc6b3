"""Node shards as Ray actors, on the Ray backend: the same `ShardWorker` as a local shard
process, in an actor of its own (no logical CPU asked, so it takes none of a node's cores from
the sandboxes). The router sends a message as an actor call and reads its answer with
`ray.get`; a dead actor reads as a closed pipe (EOFError), so the router replaces it from its
copies exactly as it replaces a dead process."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from tangram.errors import BackendUnavailable
from tangram.runtime.shards.wire import STOP, wire_dumps, wire_loads
from tangram.runtime.shards.worker import ShardInit, ShardWorker, settle_collector


def ray_is_running() -> bool:
    """True when this process is connected to a Ray cluster (the Ray backend)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


class ShardActor:
    """The actor's body: a `ShardWorker` built from the wire-pickled `ShardInit`."""

    def __init__(self, init: bytes) -> None:
        self.worker = ShardWorker(wire_loads(init))
        settle_collector()  # the actor's process is its own

    def handle(self, data: bytes) -> bytes:
        return self.worker.handle(data)[0]

    def where(self) -> tuple[int, float]:
        """(this actor's pid, its own user + system CPU seconds so far)."""
        t = os.times()
        return os.getpid(), t.user + t.system


_REMOTE: Any = None


def _ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("Ray is not installed: pip install 'arl-tangram[ray]'") from None
    return ray


@dataclass
class RayShard:
    """A node shard in a Ray actor."""

    index: int
    nodes: tuple[str, ...]
    actor: Any
    _pid: int | None = None
    _call: Any = None

    @classmethod
    def start(cls, index: int, nodes: tuple[str, ...], init: ShardInit, others: list) -> RayShard:
        global _REMOTE
        ray = _ray()
        if _REMOTE is None:
            _REMOTE = ray.remote(num_cpus=0, max_restarts=0)(ShardActor)
        actor = _REMOTE.remote(wire_dumps(init))
        shard = cls(index, nodes, actor)
        shard._pid = ray.get(actor.where.remote())[0]  # built and answering
        return shard

    @property
    def pid(self) -> int | None:
        return self._pid

    def send(self, data: bytes) -> None:
        self._call = self.actor.handle.remote(data)

    def recv(self) -> bytes:
        ray = _ray()
        call, self._call = self._call, None
        try:
            return ray.get(call)
        except ray.exceptions.RayActorError as exc:
            raise EOFError(f"shard actor died: {exc}") from None

    def cpu_s(self) -> float:
        """Its own CPU seconds so far, as the actor's process counts them (0 once it is gone)."""
        ray = _ray()
        try:
            return ray.get(self.actor.where.remote())[1]
        except ray.exceptions.RayActorError:
            return 0.0

    def stop(self) -> None:
        """Ask it to stop; `reap` waits for the answer and ends the actor."""
        self._call = self.actor.handle.remote(wire_dumps((STOP,)))

    def reap(self, timeout: float = 1.0) -> str:
        ray = _ray()
        if self._call is not None:
            try:
                ray.get(self._call, timeout=timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            self._call = None
        ray.kill(self.actor, no_restart=True)
        return "ended (Ray actor)"
