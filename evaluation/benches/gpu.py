"""`tangram bench gpu`: what the GPU manager costs and what its residency policy saves.

1. torch backend: restore (host -> device copy) and evict time for a service of `--size-mb`,
   on CUDA when available, else on the CPU standing in for the device;
2. placement decision time (chunk choice with the residency preference, plus the residency
   decision) for `--actions` queued service actions on 5 nodes x 8 GPUs;
3. restores avoided by resident-chunk preference + LRU on a bursty multi-service trace,
   against first-fit placement with random eviction (and the two mixed policies).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from evaluation.gpu_trace import chunk_of, serve
from managers.gpu.residency import RandomEviction, Residency
from managers.gpu.services import GB, RestoreModel, Service, ServiceRegistry
from managers.gpu.tinylm import TinyLMConfig
from managers.gpu.torch_backend import TorchBackend, torch_service
from tangram.actions import Action
from tangram.errors import BackendUnavailable, Infeasible
from tangram.pools import ChunkPool, Placement
from tangram.resources import Demand
from topology import ChunkTree

NODES, GPUS, GPU_MEM = 5, 8, 80 * GB


def bench_torch(size_mb: int, repeats: int) -> dict:
    cfg = TinyLMConfig.of_size(size_mb * 10**6)
    try:  # torch is optional (the gpu extra): the backend imports it when built
        backend = TorchBackend({"svc": cfg}, cpu_stand_in=True)  # CUDA when present, else CPU
    except BackendUnavailable as exc:
        return {"skipped": f"torch is not installed ({exc})"}
    service = torch_service("svc", cfg)

    async def go():
        await backend.deploy(service)
        restores, evicts = [], []
        for _ in range(repeats):
            restores.append(await backend.restore(service, "n0", (0, 1)))
            t0 = time.perf_counter()
            await backend.evict(service, "n0", (0, 1))
            evicts.append(time.perf_counter() - t0)
        await backend.close()
        return restores, evicts

    restores, evicts = asyncio.run(go())
    r = statistics.median(restores)
    return {
        "device": "cuda" if backend.cuda else "cpu (a separate copy stands for the device)",
        "bytes": cfg.nbytes(),
        "restore_s": r,
        "evict_s": statistics.median(evicts),
        "restore_gbps": cfg.nbytes() / r / GB,
    }


def services(n: int, rng: random.Random) -> ServiceRegistry:
    """n services of 10..70 GB per GPU at DoP 1, and their 2- and 4-GPU variants (sharded)."""
    reg = ServiceRegistry()
    for i in range(n):
        weights = rng.randint(10, 70) * GB
        reg.register(
            Service.sharded(
                f"svc{i}",
                weights,
                dops=(1, 2, 4),
                reserve_bytes=5 * GB,
                infer_s={1: 1.0, 2: 0.6, 4: 0.35},
            )
        )
    return reg


def cluster(reg: ServiceRegistry, eviction=None, check: bool = True):
    nodes = {f"n{i}": GPUS for i in range(NODES)}
    res = Residency.uniform(nodes, GPU_MEM, reg, eviction=eviction, check=check)
    pool = ChunkPool("gpu", {n: ChunkTree(g, n, check=check) for n, g in nodes.items()})
    return res, pool


def bench_placement(n_actions: int, seed: int, check: bool) -> dict:
    """Place and begin every queued action; when the pool is full, finish everything running
    (a scheduling round). Only place + begin are timed."""
    rng = random.Random(seed)
    reg = services(20, rng)
    res, pool = cluster(reg, check=check)
    queue = [
        Action(
            f"a{i}",
            {"gpu": Demand.fixed(rng.choice([1, 1, 1, 2, 2, 4]))},
            duration=1.0,
            service=f"svc{rng.randrange(20)}",
        )
        for i in range(n_actions)
    ]
    running: list[tuple[Action, Placement]] = []
    spent, now = 0.0, 0.0
    for a in queue:
        k = a.demands["gpu"].min
        t0 = time.perf_counter()
        try:
            where = pool.place(k, prefer=lambda n, c, a=a: res.prefer(a, "gpu", n, c))
        except Infeasible:
            spent += time.perf_counter() - t0
            now += 1.0
            for b, w in running:
                res.end(b, w.node, chunk_of(w), now)
                pool.release(w, b.demands["gpu"].min)
            running.clear()
            t0 = time.perf_counter()
            where = pool.place(k, prefer=lambda n, c, a=a: res.prefer(a, "gpu", n, c))
        res.begin(a, where.node, chunk_of(where), now)
        spent += time.perf_counter() - t0
        running.append((a, where))
    return {
        "actions": n_actions,
        "total_ms": spent * 1e3,
        "per_action_us": spent / n_actions * 1e6,
        "invariant_checks": check,
    }


def bursty_trace(
    n_services: int,
    n_calls: int,
    seed: int,
    burst_every_s: float = 1.0,
    burst_calls: float = 8.0,
    call_gap_s: float = 0.5,
) -> list[Action]:
    """Bursts of calls to one service (Zipf-popular), the bursts arriving as a Poisson stream
    (mean `burst_every_s` apart), each of about `burst_calls` calls `call_gap_s` apart."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(n_services)]
    dop = {i: rng.choice([1, 1, 2, 4]) for i in range(n_services)}
    calls: list[Action] = []
    t = 0.0
    while len(calls) < n_calls:
        t += rng.expovariate(1 / burst_every_s)
        s = rng.choices(range(n_services), weights)[0]
        bt = t
        for _ in range(min(int(rng.expovariate(1 / burst_calls)) + 1, n_calls - len(calls))):
            bt += rng.expovariate(1 / call_gap_s)
            calls.append(
                Action(
                    f"c{len(calls)}",
                    {"gpu": Demand.fixed(dop[s])},
                    service=f"svc{s}",
                    submit_time=bt,
                )
            )
    return calls


def bench_trace(n_services: int, n_calls: int, seed: int) -> dict:
    trace = bursty_trace(n_services, n_calls, seed)
    out: dict[str, Any] = {}
    for label, prefer, evict in [
        ("preference + LRU", True, None),
        ("preference + random", True, RandomEviction(seed)),
        ("first fit + LRU", False, None),
        ("first fit + random", False, RandomEviction(seed)),
    ]:
        reg = services(n_services, random.Random(seed))
        res, pool = cluster(reg, eviction=evict, check=False)
        res.restore = RestoreModel()
        served = serve(trace, pool, res, prefer=prefer)
        restores = sum(bool(s.restored) for s in served)
        out[label] = {
            "restores": restores,
            "restore_share": restores / len(served),
            "mean_act_s": statistics.fmean(s.end - s.arrival for s in served),
        }
    base = out["first fit + random"]["restores"]
    out["avoided_vs_first_fit_random"] = 1 - out["preference + LRU"]["restores"] / base
    out["avoided_vs_first_fit_lru"] = 1 - (
        out["preference + LRU"]["restores"] / out["first fit + LRU"]["restores"]
    )
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram bench gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size-mb", type=int, default=512, help="torch service size (default 512)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--actions", type=int, default=1000)
    p.add_argument("--services", type=int, default=40, help="services in the bursty trace")
    p.add_argument("--calls", type=int, default=3000, help="calls in the bursty trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    result: dict[str, Any] = {
        "torch": bench_torch(ns.size_mb, ns.repeats),
        "placement": [bench_placement(ns.actions, ns.seed, c) for c in (True, False)],
        "trace": bench_trace(ns.services, ns.calls, ns.seed),
    }
    if ns.json:
        print(json.dumps(result, indent=2))
        return 0
    t = result["torch"]
    print("1. torch backend restore / evict")
    if "skipped" in t:
        print(f"   skipped: {t['skipped']}")
    else:
        print(f"   device {t['device']}; service of {t['bytes'] / 1e6:.0f} MB")
        print(
            f"   restore {t['restore_s'] * 1e3:8.1f} ms  ({t['restore_gbps']:.1f} GB/s)   "
            f"evict {t['evict_s'] * 1e3:6.2f} ms   (median of {ns.repeats})"
        )
    print(
        f"2. placement decision, {ns.actions} queued service actions on {NODES} nodes x {GPUS} GPUs"
    )
    for pl in result["placement"]:
        checks = "with" if pl["invariant_checks"] else "without"
        print(
            f"   {pl['total_ms']:8.1f} ms total, {pl['per_action_us']:7.1f} us per action "
            f"({checks} invariant checks after each mutation)"
        )
    tr = result["trace"]
    print(
        f"3. bursty trace: {ns.calls} calls over {ns.services} services (DoP 1/2/4), "
        f"{NODES} x {GPUS} GPUs of {GPU_MEM // GB} GB"
    )
    for label in (
        "preference + LRU",
        "preference + random",
        "first fit + LRU",
        "first fit + random",
    ):
        r = tr[label]
        print(
            f"   {label:22s} restores {r['restores']:5d} ({r['restore_share']:6.1%} of calls)"
            f"   mean ACT {r['mean_act_s']:7.2f} s"
        )
    print(
        f"   restores avoided by preference + LRU: {tr['avoided_vs_first_fit_random']:.1%} vs "
        f"first fit + random, {tr['avoided_vs_first_fit_lru']:.1%} vs first fit + LRU"
    )
    return 0
