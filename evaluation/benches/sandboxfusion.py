"""`tangram bench sandboxfusion`: one burst of SandboxFusion `/run_code` requests, three ways.

The burst (seeded): `--requests` (200) from `--callers` (8) concurrent callers, each sending its
share one after another. Most are stdin/stdout cases (a Python program counting primes below
the number it reads, checked against the expected answer); one in `--pytest-every` (10) is a
pytest file of four CPU-bound tests, the kind of request that can use more than one core.

1. `tangram elastic`: through `tangram serve`'s `/run_code`; pytest requests ask
   `cpu: {min: 1, max: <cores>}` (elastic: the scheduler picks, pytest gets `-n <granted>`),
   stdin cases 1 core.
2. `tangram fixed`: the same server, every request a fixed 1 core.
3. `pool`: a one-core-per-request pool, as SandboxFusion is deployed (N workers of one core):
   the same programs run directly, each pinned to a free core, no scheduler, no HTTP.

All three run in the same process on the same machine, one after another. Figures: the burst's
makespan, each kind's mean and p95 latency (caller-side), and answers right.

`--latency`: instead, `print(1)` latency and 16-client throughput of `/run_code` beside a
minimal no-sandbox server and the raw program (`sf_latency`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from evaluation.benches import sf_latency
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app, serve_in_thread

PRIMES = (
    "n = int(input())\n"
    "print(sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k ** .5) + 1))))\n"
)
PYTEST = "".join(
    f"def test_{i}():\n    assert sum(i * i for i in range({{n}})) > 0\n" for i in range(4)
)


@dataclass(frozen=True, slots=True)
class Case:
    kind: str  # "stdin" or "pytest"
    language: str
    code: str
    stdin: str | None
    expected: str | None  # stdout of a right answer (stdin cases)


def _count_primes(n: int) -> int:
    return sum(1 for k in range(2, n) if all(k % d for d in range(2, int(k**0.5) + 1)))


def burst(requests: int, pytest_every: int, seed: int = 0) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for i in range(requests):
        if pytest_every and i % pytest_every == pytest_every - 1:
            cases.append(
                Case("pytest", "pytest", PYTEST.format(n=rng.randint(2, 3) * 10**6), None, None)
            )
        else:
            n = rng.randint(2_000, 8_000)
            cases.append(Case("stdin", "python", PRIMES, f"{n}\n", f"{_count_primes(n)}\n"))
    return cases


def _right(case: Case, ok: bool, stdout: str) -> bool:
    return ok and (case.expected is None or stdout.strip() == case.expected.strip())


async def _callers(cases: list[Case], callers: int, one) -> dict[str, Any]:
    """Run `cases` from `callers` concurrent callers; `one(case)` -> (ok, stdout)."""
    queue = list(enumerate(cases))
    latency: dict[str, list[float]] = {"stdin": [], "pytest": []}
    right = 0

    async def caller() -> None:
        nonlocal right
        while queue:
            _, case = queue.pop(0)
            t = time.perf_counter()
            ok, stdout = await one(case)
            latency[case.kind].append(time.perf_counter() - t)
            right += _right(case, ok, stdout)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    out: dict[str, Any] = {
        "makespan_s": time.perf_counter() - t0,
        "right": right,
        "requests": len(cases),
    }
    for kind, values in latency.items():
        if values:
            out[f"{kind}_mean_s"] = statistics.fmean(values)
            out[f"{kind}_p95_s"] = sorted(values)[int(0.95 * (len(values) - 1))]
    return out


async def _through_tangram(
    url: str, cases: list[Case], callers: int, elastic: bool
) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def one(case: Case) -> tuple[bool, str]:
            body: dict[str, Any] = {
                "code": case.code,
                "language": case.language,
                "stdin": case.stdin,
                "run_timeout": 120,
            }
            if elastic and case.kind == "pytest":
                body["cpu"] = {"min": 1, "max": cores}
            doc = (await http.post("/run_code", json=body)).json()
            return doc.get("status") == "Success", (doc.get("run_result") or {}).get("stdout", "")

        return await _callers(cases, callers, one)


async def _pool(cases: list[Case], callers: int) -> dict[str, Any]:
    """One core per request: a free core from the pool, the program pinned to it."""
    free: asyncio.Queue[int] = asyncio.Queue()
    for core in sorted(os.sched_getaffinity(0)):
        free.put_nowait(core)

    async def one(case: Case) -> tuple[bool, str]:
        core = await free.get()
        workdir = tempfile.mkdtemp(prefix="tangram-bench-pool-")
        try:
            source = "test_main.py" if case.kind == "pytest" else "main.py"
            with open(os.path.join(workdir, source), "w") as f:
                f.write(case.code)
            argv = (
                ["python3", "-m", "pytest", "-q", source]
                if case.kind == "pytest"
                else ["python3", source]
            )
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workdir,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=lambda: os.sched_setaffinity(0, {core}),
            )
            out, _ = await proc.communicate((case.stdin or "").encode())
            return proc.returncode == 0, out.decode(errors="replace")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            free.put_nowait(core)

    return await _callers(cases, callers, one)


def main(argv: list[str]) -> int:
    if "--latency" in argv:  # the latency and throughput comparison (`sf_latency`)
        return sf_latency.main(argv)
    parser = argparse.ArgumentParser(
        prog="tangram bench sandboxfusion",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument(
        "--pytest-every",
        type=int,
        default=10,
        metavar="K",
        help="every K-th request is a pytest file (0: none)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    ns = parser.parse_args(argv)
    cases = burst(ns.requests, ns.pytest_every)
    tg = Tangram.local()
    figures: dict[str, Any] = {
        "cores": len(os.sched_getaffinity(0)),
        "cpu_backend": tg.status().cpu_backend,
    }
    with serve_in_thread(create_app(tg)) as url:
        figures["tangram elastic"] = asyncio.run(_through_tangram(url, cases, ns.callers, True))
        figures["tangram fixed"] = asyncio.run(_through_tangram(url, cases, ns.callers, False))
    figures["pool"] = asyncio.run(_pool(cases, ns.callers))
    if ns.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"{ns.requests} requests ({sum(c.kind == 'pytest' for c in cases)} pytest) from "
        f"{ns.callers} callers on {figures['cores']} cores ({figures['cpu_backend']} backend)"
    )
    print(
        f"{'':18s} {'makespan':>9s} {'stdin mean':>11s} {'stdin p95':>10s} "
        f"{'pytest mean':>12s} {'pytest p95':>11s} {'right':>7s}"
    )
    for name in ("tangram elastic", "tangram fixed", "pool"):
        f = figures[name]
        print(
            f"{name:18s} {f['makespan_s']:8.2f}s {f.get('stdin_mean_s', 0):10.3f}s "
            f"{f.get('stdin_p95_s', 0):9.3f}s {f.get('pytest_mean_s', 0):11.3f}s "
            f"{f.get('pytest_p95_s', 0):10.3f}s {f['right']:>3d}/{f['requests']}"
        )
    return 0
