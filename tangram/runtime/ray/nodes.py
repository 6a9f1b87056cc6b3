"""Membership of the Ray CPU pool: which Ray nodes have an agent, which are lost, and the
watcher that keeps both true.

A watcher polls `ray.nodes()` every `poll_s`: a node joining gets an agent and its cores join
the pool (its memory the environment table); a node (or its agent) dying is lost: the hooks in
`on_lost` hear of it at once (the GPU manager takes its chunks out), its environments are lost
(the CPU manager fails every later exec in them with the reason), and it takes no new
environment. A lost node stays in the pool until its environments are closed and its cores
come back; then it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from managers.cpu.environments import EnvironmentTable
from tangram.pools import CorePool
from tangram.runtime.ray.agent import NodeInfo
from tangram.runtime.ray.remote import RemoteAgent, import_ray
from topology import CpuNode

log = logging.getLogger("tangram.ray")

Spawn = Callable[[str, Mapping[str, float]], RemoteAgent | None]


@dataclass(slots=True)
class RayNode:
    info: NodeInfo
    agent: RemoteAgent
    lost: str = ""  # why, once the node or its agent died


def alive_nodes() -> dict[str, dict]:
    """Ray's alive nodes by Ray node id."""
    return {n["NodeID"]: n for n in import_ray().nodes() if n.get("Alive")}


class RayNodes:
    """The nodes with an agent: cores in `pool`, memory in `envs` (the one environment table,
    which the CPU manager reads for bindings), agents started by `spawn`."""

    def __init__(
        self, pool: CorePool, envs: EnvironmentTable, spawn: Spawn, poll_s: float = 1.0
    ) -> None:
        self.pool = pool
        self.envs = envs
        self.spawn = spawn
        self.poll_s = poll_s
        self.nodes: dict[str, RayNode] = {}
        self.on_lost: list[Callable[[str, str], None]] = []  # (node, why) when a node dies
        self._joining: set[str] = set()
        self._watcher: asyncio.Task | None = None
        self.closed = False

    def join(self, agent: RemoteAgent, info: NodeInfo) -> None:
        self.nodes[info.name] = RayNode(info, agent)
        self.pool.add_node(CpuNode(info.name, info.numa))
        self.envs.add_node(info.name, info.memory_mb)
        log.info(
            "ray: node %s joined (%d cores, %d MiB, %d GPUs, backend %s)",
            info.name,
            info.cores,
            info.memory_mb,
            info.gpus,
            info.backend,
        )

    def lost_nodes(self) -> set[str]:
        return {n for n, s in self.nodes.items() if s.lost}

    def lose(self, name: str, why: str) -> None:
        node = self.nodes.get(name)
        if node is None or node.lost:
            return
        node.lost = why
        log.warning(
            "ray: node %s (Ray node %s) %s: %d environments lost",
            name,
            node.info.ray_node_id[:12],
            why,
            len(self.envs.on_node(name)),
        )
        for hook in self.on_lost:
            hook(name, why)
        self.retire_drained()

    def retire_drained(self) -> None:
        """A lost node leaves the pool once nothing of it is granted or bound."""
        for name, node in list(self.nodes.items()):
            if (
                node.lost
                and not self.envs.on_node(name)
                and self.pool.free(name) == self.pool.capacity(name)
            ):
                self.pool.remove_node(name)
                self.envs.remove_node(name)
                del self.nodes[name]
                log.info("ray: node %s left the pool", name)

    def describe(self) -> dict[str, dict[str, Any]]:
        return {
            n: {
                "ray_node_id": s.info.ray_node_id,
                "cores": s.info.cores,
                "memory_mb": s.info.memory_mb,
                "gpus": s.info.gpus,
                "lost": s.lost or None,
                "envs": len(self.envs.on_node(n)),
                "backend": s.info.backend,
            }
            for n, s in self.nodes.items()
        }

    # -- the watcher ---------------------------------------------------------------------------
    def ensure_watcher(self) -> None:
        if self._watcher is None and not self.closed and self.poll_s > 0:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.refresh(await loop.run_in_executor(None, alive_nodes))
            except asyncio.CancelledError:
                raise
            except Exception:  # a flaky GCS answer must not stop membership
                log.exception("ray: membership poll failed")
            await asyncio.sleep(self.poll_s)

    async def refresh(self, alive: Mapping[str, Mapping[str, Any]]) -> None:
        """Reconcile with the live Ray nodes: lose the dead, start agents on the new."""
        known = {s.info.ray_node_id: n for n, s in self.nodes.items()}
        for rid, name in known.items():
            if rid not in alive:
                self.lose(name, "died (Ray reports the node dead)")
        self.retire_drained()
        for rid, n in alive.items():
            if rid in known or rid in self._joining:
                continue
            agent = self.spawn(rid, n["Resources"])
            if agent is None:
                continue
            self._joining.add(rid)
            try:
                info = await agent.start()
            except Exception as exc:
                log.warning("ray: agent on new node %s did not start: %s", rid[:12], exc)
                continue
            finally:
                self._joining.discard(rid)
            if not self.closed:
                self.join(agent, info)

    async def close(self) -> None:
        """Stop watching; close the live agents (10 s at most), then kill every agent."""
        self.closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        live = [n.agent for n in self.nodes.values() if not n.lost]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(a.close() for a in live), return_exceptions=True), 10.0
            )
        for n in self.nodes.values():
            with contextlib.suppress(Exception):
                n.agent.kill()
