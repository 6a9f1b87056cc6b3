"""NVML discovery into chunk trees, fed with made-up discovery results (no GPU needed)."""

from __future__ import annotations

from managers.gpu.discovery import discover_inventory, inventory_from
from topology import GpuDiscovery, GpuInfo


def gpus(n: int, mem: int = 80 * 10**9):
    return tuple(GpuInfo(i, "H100", mem) for i in range(n))


def test_no_gpu_gives_an_empty_inventory_with_a_reason() -> None:
    inv = inventory_from(GpuDiscovery(reason="no NVIDIA driver"), "h")
    assert inv.empty and inv.reason == "no NVIDIA driver"
    real = discover_inventory("h")
    assert real.empty == (not real.trees) and (real.reason or real.trees)


def test_eight_nvlinked_gpus_make_one_eight_gpu_tree() -> None:
    inv = inventory_from(GpuDiscovery(gpus(8), nvlink_groups=(tuple(range(8)),)), "h")
    assert inv.trees["h"].num_gpus == 8 and inv.memory["h"] == [80 * 10**9] * 8
    assert inv.pool().capacity() == 8 and not inv.notes


def test_six_gpus_use_a_power_of_two_prefix() -> None:
    inv = inventory_from(GpuDiscovery(gpus(6)), "h")
    assert inv.trees["h"].num_gpus == 4 and "not a power of two" in inv.notes[0]


def test_chunks_do_not_span_nvlink_groups() -> None:
    inv = inventory_from(GpuDiscovery(gpus(8), nvlink_groups=((0, 1, 2, 3), (4, 5, 6, 7))), "h")
    assert inv.trees["h"].num_gpus == 4 and "span NVLink" in inv.notes[-1]
