"""Discovery of this machine's cores, NUMA domains (from /sys) and GPUs (through NVML)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SYS_NODE = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's cpulist format, e.g. '0-3,8,10-11'."""
    cores: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            cores.extend(range(int(lo), int(hi) + 1))
        else:
            cores.append(int(part))
    return cores


def discover_numa(root: Path = SYS_NODE) -> dict[int, list[int]]:
    """NUMA domain -> usable core ids (restricted to this process's affinity mask).

    Falls back to one domain holding every usable core where /sys has no NUMA information.
    """
    allowed = sorted(os.sched_getaffinity(0))
    domains: dict[int, list[int]] = {}
    if root.is_dir():
        for d in sorted(root.glob("node[0-9]*")):
            cpulist = d / "cpulist"
            if cpulist.is_file():
                cores = [c for c in parse_cpulist(cpulist.read_text()) if c in set(allowed)]
                if cores:
                    domains[int(d.name[4:])] = cores
    seen = {c for cores in domains.values() for c in cores}
    missing = [c for c in allowed if c not in seen]
    if not domains:
        return {0: allowed}
    if missing:
        domains.setdefault(min(domains), []).extend(missing)
    return domains


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int
    nvlink_peers: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuDiscovery:
    """GPUs NVML reported; when there are none, `reason` says why (no driver, no device...)."""

    gpus: tuple[GpuInfo, ...] = ()
    reason: str = ""
    nvlink_groups: tuple[tuple[int, ...], ...] = field(default=())


def discover_gpus() -> GpuDiscovery:
    """Ask NVML for the GPUs, their memory and NVLink peers. Never raises."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - dependency is declared
        return GpuDiscovery(reason=f"pynvml is not importable ({exc}); install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses, OSError when libnvidia-ml is absent
        return GpuDiscovery(reason=f"no NVIDIA driver: NVML failed to initialise ({exc})")
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return GpuDiscovery(reason="NVML reports 0 GPUs")
        bus_to_index: dict[str, int] = {}
        handles = []
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus_to_index[bus.decode() if isinstance(bus, bytes) else bus] = i
        gpus = []
        for i, h in enumerate(handles):
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            gpus.append(
                GpuInfo(
                    i,
                    name.decode() if isinstance(name, bytes) else name,
                    int(mem),
                    _nvlink_peers(pynvml, h, bus_to_index),
                )
            )
        return GpuDiscovery(gpus=tuple(gpus), nvlink_groups=_groups(gpus))
    except Exception as exc:
        return GpuDiscovery(reason=f"NVML query failed: {exc}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvlink_peers(pynvml, handle, bus_to_index: dict[str, int]) -> tuple[int, ...]:
    peers: set[int] = set()
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            bus = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
        except Exception:
            continue
        bus = bus.decode() if isinstance(bus, bytes) else bus
        if bus in bus_to_index:
            peers.add(bus_to_index[bus])
    return tuple(sorted(peers))


def _groups(gpus: list[GpuInfo]) -> tuple[tuple[int, ...], ...]:
    """Connected components of the NVLink graph (single GPUs where NVML reports no links)."""
    import networkx as nx

    g = nx.Graph()
    for info in gpus:
        g.add_node(info.index)
        for p in info.nvlink_peers:
            g.add_edge(info.index, p)
    return tuple(sorted(tuple(sorted(c)) for c in nx.connected_components(g)))
