"""The production GPU path of `Tangram.local()`: the pool is sized from NVML discovery (injected
here) and runs the torch backend (on CUDA where present, else the CPU standing in); without a
GPU the pool is simulated, said at WARNING and in the status, and a call's result says so; the
torch backend refuses "on GPU" without CUDA unless asked to stand in. Tests that inject more
GPUs than CUDA has only build the pool (no CUDA call) or skip, naming the devices they need."""

from __future__ import annotations

import asyncio
import logging

import pytest

torch = pytest.importorskip("torch")  # the `gpu` extra: third-party, optional

from tangram import Tangram
from tangram.errors import BackendUnavailable, ValidationError
from tangram.runtime.config import build_local
from topology import GpuDiscovery, GpuInfo

MODEL = {"vocab": 64, "dim": 32, "layers": 1, "heads": 4, "max_len": 32}
SERVICES = {"lm": {"memory_gb": 0.01, "dops": [1, 2], "model": MODEL}}
STAND_IN = {"options": {"cpu_stand_in": True}}


def gpus(n: int, gb: int = 80) -> GpuDiscovery:
    infos = tuple(
        GpuInfo(i, "NVIDIA H100", gb * 10**9, tuple(j for j in range(n) if j != i))
        for i in range(n)
    )
    return GpuDiscovery(infos, nvlink_groups=(tuple(range(n)),))


def needs_cuda_devices(n: int) -> None:
    """Skip where CUDA is present with fewer than `n` devices: an injected discovery of `n`
    GPUs would then send real CUDA calls to devices that do not exist. Without CUDA the CPU
    stands in for any number of GPUs."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have and have < n:
        pytest.skip(f"needs {n} CUDA devices, this machine has {have}")


def no_gpu() -> GpuDiscovery:
    return GpuDiscovery(reason="NVML: no driver")


def test_two_discovered_gpus_make_a_two_gpu_pool_on_the_torch_backend():
    needs_cuda_devices(2)  # a 2-GPU call restores on GPUs 0 and 1
    tg = Tangram.local(
        cpu_backend="sim", services=SERVICES, gpu=STAND_IN, discover=lambda: gpus(2, gb=141)
    )

    async def go():
        async with tg:
            st = tg.status()
            r = await tg.invoke("lm", {"tokens": [[1, 2, 3], [4, 5, 6]]}, gpus=2)
            return st, r

    st, r = asyncio.run(go())
    assert tg.gpu.backend_name == "torch" and not tg.gpu.simulated
    assert tg.gpu.pool.capacity() == 2 and tg.gpu.pool.nodes() == ["gpu0"]
    assert [g.memory for g in tg.gpu.residency._gpus["gpu0"]] == [141 * 10**9] * 2
    assert st.gpu_backend == "torch" and st.gpu_simulated is False
    assert "discovered (NVML): 2 GPUs" in st.gpu_pool
    assert r.status == "ok" and r.output["replicas"] == 2 and len(r.output["logprobs"]) == 2
    assert "simulated" not in r.output


def test_six_discovered_gpus_use_the_power_of_two_prefix():
    c = build_local(cpu_backend="sim", services=SERVICES, gpu=STAND_IN, discover=lambda: gpus(6))
    assert c.gpu.pool.capacity() == 4 and "not a power of two" in c.gpu.origin


def test_no_gpu_means_a_simulated_pool_said_at_warning_in_status_and_in_results(caplog):
    with caplog.at_level(logging.WARNING, logger="tangram"):
        tg = Tangram.local(
            cpu_backend="sim",
            discover=no_gpu,
            services={"j": {"memory_gb": 1, "infer_s": {1: 0.01}}},
        )
    assert any("SIMULATED GPU pool" in m and "no driver" in m for m in caplog.messages)

    async def go():
        async with tg:
            return tg.status(), await tg.invoke("j", {"q": 1})

    st, r = asyncio.run(go())
    assert st.gpu_simulated is True and "SIMULATED" in st.gpu_pool
    assert r.status == "ok" and r.output["simulated"] is True and r.output["request"] == {"q": 1}


def test_torch_refuses_without_cuda_unless_asked_to_stand_in():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    with pytest.raises(BackendUnavailable, match="no CUDA device.*cpu_stand_in"):
        build_local(cpu_backend="sim", services=SERVICES, discover=lambda: gpus(2))


def test_a_service_without_a_model_on_torch_names_the_field():
    with pytest.raises(ValidationError) as e:
        build_local(
            cpu_backend="sim",
            services={"j": {"memory_gb": 1}},
            gpu=STAND_IN,
            discover=lambda: gpus(2),
        )
    assert e.value.field == "gpu.services.j.model"
    with pytest.raises(ValidationError) as e:
        build_local(
            cpu_backend="sim",
            services={"j": {"memory_gb": 1, "model": {"dimm": 3}}},
            gpu=STAND_IN,
            discover=lambda: gpus(2),
        )
    assert e.value.field == "gpu.services.j.model.dimm"


def test_configured_sizes_win_over_discovery():
    c = build_local(
        cpu_backend="sim",
        services=SERVICES,
        gpu={"nodes": 2, "gpus_per_node": 4, **STAND_IN},
        discover=lambda: gpus(8),
    )
    assert c.gpu.pool.capacity() == 8 and c.gpu.pool.nodes() == ["gpu0", "gpu1"]
    assert c.gpu.origin.startswith("configured")
