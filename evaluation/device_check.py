"""On a CUDA machine: the torch backend's restore bandwidth against the raw host-to-GPU copy.

Run with `python -m evaluation.device_check [--size-mb 2048] [--repeats 5] [--json]`.
Measures (1) a raw copy of one pinned host buffer of the same size to GPU 0 (the reference
limit of this link), (2) the torch backend's restore of a TinyLM service of that size (many
tensors, pinned, non-blocking, one synchronise), and its evict, checking that
`torch.cuda.memory_allocated` rises by the service's bytes and falls back, and (3) the
production path: `Tangram.local()` with nothing configured sizes its GPU pool from NVML (the
largest power-of-two prefix of the GPUs inside one NVLink group) on the torch backend, not
simulated, and a 1-GPU call restores the model and runs it on a real GPU. Before the figures
it runs every GPU test (`gpu_test_files`: each test file under tests/ that needs torch at its
top) in a pytest child process and prints what passed, failed and skipped, with the reasons
(a test needing more GPUs than the machine has skips, saying so); `--no-tests` leaves them out.
Exits 2 when torch or a CUDA device is missing (saying which, and checking nothing), 1 when a
check or a test fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from managers.gpu.tinylm import TinyLMConfig
from managers.gpu.torch_backend import TorchBackend, torch_service
from tangram import Tangram
from tangram.results import Status
from topology import is_pow2

ROOT = Path(__file__).resolve().parents[1]
# what makes a test file a GPU test: torch needed at its top (it skips as a whole without it)
GPU_TEST = re.compile(r'^\w+ = pytest\.importorskip\("torch"\)', re.MULTILINE)


def gpu_test_files(tests: Path = ROOT / "tests") -> list[Path]:
    """Every test file under `tests` that is a GPU test (`GPU_TEST`), sorted."""
    return sorted(p for p in tests.rglob("test_*.py") if GPU_TEST.search(p.read_text()))


def run_gpu_tests(files: list[Path], cwd: Path = ROOT, timeout_s: float = 300) -> dict:
    """The files' tests in a pytest child process (its own CUDA context, freed when it exits):
    counts, and each failure's and skip's test and message."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "gpu-tests.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        cmd += [f"--junitxml={xml}", *map(str, files)]
        try:
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            failure = ("pytest", f"timed out after {timeout_s:g} s")
            out = {"rc": None, "passed": 0, "failed": 0, "skipped": 0, "errors": 1}
            return {**out, "failures": [failure], "skips": [], "ok": False, "output_tail": ""}
        cases = ET.parse(xml).getroot().iter("testcase") if xml.exists() else iter(())
        out: dict[str, Any] = {"rc": proc.returncode, "passed": 0, "failed": 0, "skipped": 0}
        out.update(errors=0, failures=[], skips=[])
        for case in cases:
            test = f"{case.get('classname')}::{case.get('name')}"
            kinds = {c.tag: (c.get("message") or "").split("\n")[0][:300] for c in case}
            if "failure" in kinds or "error" in kinds:
                out["failed" if "failure" in kinds else "errors"] += 1
                out["failures"].append((test, kinds.get("failure", kinds.get("error"))))
            elif "skipped" in kinds:
                out["skipped"] += 1
                out["skips"].append((test, kinds["skipped"]))
            else:
                out["passed"] += 1
    out["ok"] = proc.returncode == 0 and not out["failed"] and not out["errors"]
    out["output_tail"] = "" if out["ok"] else (proc.stdout + proc.stderr)[-6000:]
    return out


def print_tests(files: list[Path], t: dict) -> None:
    names = ", ".join(str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f) for f in files)
    counts = f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors"
    print(
        f"GPU tests ({names}): {counts}, {t['skipped']} skipped -> {'ok' if t['ok'] else 'FAILED'}"
    )
    for test, why in t["skips"]:
        print(f"  skipped {test}: {why}")
    for test, why in t["failures"]:
        print(f"  FAILED  {test}: {why}")
    if not t["ok"] and t["output_tail"]:
        print(t["output_tail"])


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
                "call_ok": r.status is Status.OK,
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
        and out["call_ok"]
        and out["call_logprobs"] == 3
    )
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evaluation.device_check", description=__doc__)
    p.add_argument("--size-mb", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-tests", action="store_true", help="the figures only")
    p.add_argument("--tests-timeout", type=float, default=300, help="seconds (default 300)")
    return p


def _cuda_torch() -> Any:
    """torch, where it is installed and sees a CUDA device; else None, having said why."""
    try:
        import torch  # optional third-party dependency (the gpu extra)
    except ImportError as exc:
        print(
            f"device check: torch is not installed ({exc}); install the gpu extra "
            "(pip install 'arl-tangram[gpu]') on a CUDA machine. Nothing was checked.",
            file=sys.stderr,
        )
        return None
    if not torch.cuda.is_available():
        print(
            f"device check: this machine has no CUDA device (torch {torch.__version__}: "
            "torch.cuda.is_available() is False). Nothing was checked: the figures and the GPU "
            "tests on CUDA need one (without it the ordinary suite runs those tests on the CPU "
            "stand-in).",
            file=sys.stderr,
        )
        return None
    return torch


def _measure(ns: argparse.Namespace, torch: Any) -> dict[str, Any]:
    """The GPU tests (unless `--no-tests`), the copy and restore figures, the production path,
    and whether the checks and the tests pass (`checks_pass`, `tests_pass`)."""
    n = torch.cuda.device_count()
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "cuda_devices": n,
        "torch": torch.__version__,
    }
    if not ns.no_tests:
        files = gpu_test_files()
        result["gpu_test_files"] = [str(f.relative_to(ROOT)) for f in files]
        result["gpu_tests"] = run_gpu_tests(files, timeout_s=ns.tests_timeout)
        if not ns.json:
            print(f"{n} CUDA device(s); GPU 0: {result['gpu']}, torch {result['torch']}")
            print_tests(files, result["gpu_tests"])
    result["raw_pinned_h2d_gbps"] = raw_copy_gbps(ns.size_mb * 10**6, ns.repeats)
    result.update(backend_check(ns.size_mb, ns.repeats))
    result["restore_vs_raw"] = result["restore_gbps"] / result["raw_pinned_h2d_gbps"]
    result["production_path"] = pool_check()
    result["checks_pass"] = (
        all(g >= result["bytes"] for g in result["allocated_after_restore"])
        and all(f == 0 for f in result["allocated_after_evict"])
        and result["logprobs_finite"]
        and result["production_path"]["pool_ok"]
    )
    result["tests_pass"] = ns.no_tests or result["gpu_tests"]["ok"]
    return result


def _print_figures(result: dict[str, Any], tests_run: bool) -> None:
    print(f"GPU {result['gpu']} ({result['cuda_devices']} CUDA device(s)), torch {result['torch']}")
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
        f"{'ok' if result['checks_pass'] else 'FAILED'}"
    )
    pp = result["production_path"]
    print(
        f"Tangram.local(): {pp['pool_gpus']} of {pp['cuda_devices']} GPUs on "
        f"{pp['gpu_backend']} (simulated: {pp['gpu_simulated']}; {pp['gpu_pool']}); "
        f"a call: {pp['call_status']} -> {'ok' if pp['pool_ok'] else 'FAILED'}"
    )
    if tests_run:
        print(f"GPU tests: {'ok' if result['tests_pass'] else 'FAILED'} (above)")


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    torch = _cuda_torch()
    if torch is None:
        return 2
    result = _measure(ns, torch)
    if ns.json:
        print(json.dumps(result, indent=2))
    else:
        _print_figures(result, tests_run=not ns.no_tests)
    return 0 if result["checks_pass"] and result["tests_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
