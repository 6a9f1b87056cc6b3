"""This machine's GPUs (NVML) as a chunk pool and per-GPU memory for the residency cache.

A chunk tree needs a power-of-two GPU count with chunks that are fast inside (the paper's
aligned chunks are NVLink-connected on an HGX board). The node's tree therefore covers the
largest power-of-two prefix of the GPUs, shrunk until every chunk of two or more GPUs lies in
one NVLink group when NVML reports links; GPUs left out are named in `notes`. Without a GPU
the inventory is empty and `reason` says why (no driver, no device, pynvml missing).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from tangram.pools import ChunkPool
from topology import ChunkTree, GpuDiscovery, discover_gpus, pow2_floor


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """GPU nodes as chunk trees, each GPU's memory in bytes, and what was left out and why."""

    trees: dict[str, ChunkTree] = field(default_factory=dict)
    memory: dict[str, list[int]] = field(default_factory=dict)
    reason: str = ""
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.trees

    def pool(self, resource: str = "gpu") -> ChunkPool:
        return ChunkPool(resource, self.trees)


def _within_groups(count: int, groups: tuple[tuple[int, ...], ...]) -> bool:
    """Every GPU 0..count-1 shares an NVLink group with the other GPUs of the count-chunk."""
    if not groups or all(len(g) == 1 for g in groups):
        return True  # NVML reports no links (PCIe box): nothing to respect
    group_of = {gpu: i for i, g in enumerate(groups) for gpu in g}
    return len({group_of.get(gpu) for gpu in range(count)}) == 1


def inventory_from(found: GpuDiscovery, node: str | None = None) -> GpuInventory:
    """The chunk tree of one node from a discovery result (pure; tests feed fake results)."""
    node = node or socket.gethostname()
    if not found.gpus:
        return GpuInventory(reason=found.reason or "no GPUs found")
    gpus = sorted(found.gpus, key=lambda g: g.index)
    count = pow2_floor(len(gpus))
    notes = []
    if count < len(gpus):
        notes.append(f"{len(gpus)} GPUs is not a power of two: chunk tree over GPUs 0..{count - 1}")
    while count > 1 and not _within_groups(count, found.nvlink_groups):
        count //= 2
        notes.append(f"GPUs 0..{2 * count - 1} span NVLink groups: chunk tree over 0..{count - 1}")
    memory = [g.memory_bytes for g in gpus[:count]]
    return GpuInventory({node: ChunkTree(count, node)}, {node: memory}, "", tuple(notes))


def discover_inventory(node: str | None = None) -> GpuInventory:
    """Ask NVML about this machine; never raises (an empty inventory carries the reason)."""
    return inventory_from(discover_gpus(), node)
