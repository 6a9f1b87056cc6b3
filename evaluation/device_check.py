"""On a CUDA machine: the torch backend's restore bandwidth against the raw host-to-GPU copy.

Run with `python -m evaluation.device_check [--size-mb 2048] [--repeats 5] [--json]`.
Measures (1) a raw copy of one pinned host buffer of the same size to GPU 0 (the reference
limit of this link), (2) the torch backend's restore of a TinyLM service of that size (many
tensors, pinned, non-blocking, one synchronise), and its evict, checking that
`torch.cuda.memory_allocated` rises by the service's bytes and falls back, and (3) the
production path: `Tangram.local()` with nothing configured sizes its GPU pool from NVML (the
largest power-of-two prefix of the GPUs inside one NVLink group) on the torch backend, not
simulated, and a 1-GPU call restores the model and runs it on a real GPU. Exits 2 when no CUDA
device is present, 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from typing import Any

from managers.gpu.tinylm import TinyLMConfig
from managers.gpu.torch_backend import TorchBackend, torch_service
from tangram import Tangram
from topology import is_pow2


def raw_copy_gbps(nbytes: int, repeats: int) -> float:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dev.copy_(host, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del dev
    torch.cuda.empty_cache()
    return nbytes / statistics.median(times) / 1e9


def backend_check(size_mb: int, repeats: int) -> dict:
    import torch  # optional third-party dependency (the gpu extra)

    cfg = TinyLMConfig.of_size(size_mb * 10**6, dtype="bfloat16")
    backend = TorchBackend({"svc": cfg}, use_cuda=True)
    service = torch_service("svc", cfg)
    req = {"tokens": [[1, 2, 3, 4, 5, 6, 7, 8]]}

    async def go() -> dict:
        await backend.deploy(service)
        await backend.restore(service, "n0", (0, 1))  # warm-up (allocator, CUDA context)
        await backend.evict(service, "n0", (0, 1))
        base = torch.cuda.memory_allocated(0)
        restores, evicts, grew, freed = [], [], [], []
        for _ in range(repeats):
            restores.append(await backend.restore(service, "n0", (0, 1)))
            grew.append(torch.cuda.memory_allocated(0) - base)
            t0 = time.perf_counter()
            await backend.evict(service, "n0", (0, 1))
            evicts.append(time.perf_counter() - t0)
            freed.append(torch.cuda.memory_allocated(0) - base)
        await backend.restore(service, "n0", (0, 1))
        t0 = time.perf_counter()
        out = await backend.invoke(service, "n0", (0, 1), req)
        infer = time.perf_counter() - t0
        tensors = len(backend.host["svc"])
        await backend.close()
        r = statistics.median(restores)
        return {
            "bytes": cfg.nbytes(),
            "tensors": tensors,
            "restore_s": r,
            "restore_gbps": cfg.nbytes() / r / 1e9,
            "evict_s": statistics.median(evicts),
            "invoke_s": infer,
            "allocated_after_restore": grew,
            "allocated_after_evict": freed,
            "logprobs_finite": all(math.isfinite(v) for v in out["logprobs"][0]),
        }

    return asyncio.run(go())


def pool_check() -> dict:
    """`Tangram.local()` on this machine's GPUs: pool size, backend, and one real call."""
    import torch

    model = {"vocab": 256, "dim": 256, "layers": 2, "heads": 4, "max_len": 64}
    services = {"lm": {"memory_gb": 1, "dops": [1], "model": model}}
    tg = Tangram.local(cpu_backend="sim", services=services)

    async def go() -> dict:
        async with tg:
            st = tg.status()
            r = await tg.invoke("lm", {"tokens": [[1, 2, 3, 4]]}, gpus=1)
            return {
                "pool_gpus": tg.gpu.pool.capacity(),
                "cuda_devices": torch.cuda.device_count(),
                "gpu_backend": st.gpu_backend,
                "gpu_simulated": st.gpu_simulated,
                "gpu_pool": st.gpu_pool,
                "call_status": str(r.status),
                "call_restore_s": r.restore_s,
                "call_logprobs": len(r.output["logprobs"][0]) if r.output else 0,
            }

    out = asyncio.run(go())
    n = out["cuda_devices"]
    out["pool_ok"] = (
        out["gpu_backend"] == "torch"
        and out["gpu_simulated"] is False
        and 1 <= out["pool_gpus"] <= n
        and is_pow2(out["pool_gpus"])
        and out["call_status"] == "ok"
        and out["call_logprobs"] == 3
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluation.device_check", description=__doc__)
    p.add_argument("--size-mb", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "raw_pinned_h2d_gbps": raw_copy_gbps(ns.size_mb * 10**6, ns.repeats),
    }
    result.update(backend_check(ns.size_mb, ns.repeats))
    result["restore_vs_raw"] = result["restore_gbps"] / result["raw_pinned_h2d_gbps"]
    result["production_path"] = pool_check()
    ok = (
        all(g >= result["bytes"] for g in result["allocated_after_restore"])
        and all(f == 0 for f in result["allocated_after_evict"])
        and result["logprobs_finite"]
        and result["production_path"]["pool_ok"]
    )
    result["checks_pass"] = ok
    if ns.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"GPU {result['gpu']}, torch {result['torch']}")
        print(f"raw pinned H2D copy         {result['raw_pinned_h2d_gbps']:6.1f} GB/s")
        print(
            f"torch backend restore       {result['restore_gbps']:6.1f} GB/s "
            f"({result['restore_vs_raw']:.0%} of raw; {result['bytes'] / 1e9:.2f} GB in "
            f"{result['tensors']} tensors, {result['restore_s'] * 1e3:.1f} ms)"
        )
        print(f"evict {result['evict_s'] * 1e3:.2f} ms, invoke {result['invoke_s'] * 1e3:.1f} ms")
        print(
            f"memory counters: +{result['allocated_after_restore']} after restore, "
            f"{result['allocated_after_evict']} after evict -> "
            f"{'ok' if ok else 'FAILED'}"
        )
        pp = result["production_path"]
        print(
            f"Tangram.local(): {pp['pool_gpus']} of {pp['cuda_devices']} GPUs on "
            f"{pp['gpu_backend']} (simulated: {pp['gpu_simulated']}; {pp['gpu_pool']}); "
            f"a call: {pp['call_status']} -> {'ok' if pp['pool_ok'] else 'FAILED'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
