"""`tangram bench runtime`: how many actions per second the runtime turns over.

1. In-process: N no-op actions through `Tangram`, side by side with N no-op Ray tasks in the
   same run. Our no-op action is an `exec` on the simulated CPU backend: it goes through all of
   the runtime (validation, the queue, the policy's decision, core placement, the manager's
   run, completion, metrics) but spawns no process, since a Ray no-op task spawns none either.
   Both run the same closed loop after a warm-up: `--in-flight` (100) outstanding, the next
   submitted as one finishes (like agents awaiting their actions).
2. Over HTTP: M real `true` execs (a process in its environment's cgroup, or whatever backend
   `Tangram.local()` picks) against a `tangram serve` subprocess, from C concurrent clients
   (each its own environment, sending its share one after another): throughput, p50/p99 ACT
   (server-side, queued + run) and round trip (client-side), lost actions (a request with no
   `ok` result), and the server's resident memory (now and peak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.errors import TangramError
from tangram.runtime.client import TangramClient
from tangram.runtime.facade import Tangram


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# -- in-process ----------------------------------------------------------------------------------


async def _tangram_noops(n: int, in_flight: int) -> dict[str, Any]:
    """`in_flight` agents (one environment each) each submit their next no-op as soon as the
    last one returns, until n have run."""

    async with Tangram(cpu=CpuManager(SimCpuBackend())) as tg:
        ids = [await tg.open_env(f"bench-{i}", memory_mb=1) for i in range(in_flight)]
        left = n
        ok = 0

        async def agent(env: str) -> None:
            nonlocal left, ok
            while left > 0:
                left -= 1
                result = await tg.exec(env, "true")  # read ok only after the await
                ok += result.ok

        await asyncio.gather(*[tg.exec(e, "true") for e in ids])  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*[agent(e) for e in ids])
        wall = time.perf_counter() - t0
    return {"actions": n, "ok": ok, "in_flight": in_flight, "wall_s": wall, "per_s": n / wall}


def _ray_noops(n: int, in_flight: int) -> dict[str, Any]:
    """The same closed loop on Ray: `in_flight` tasks outstanding, one submitted per finish."""
    try:
        import ray
    except ImportError:
        return {"missing": "Ray is not installed: pip install 'arl-tangram[ray]'"}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    t0 = time.perf_counter()
    # a fresh one-node Ray of its own on loopback (never joins a cluster already running here)
    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        object_store_memory=100 << 20,
        log_to_driver=False,
        logging_level="ERROR",
    )
    started = time.perf_counter() - t0
    try:

        @ray.remote
        def noop() -> None:
            return None

        ray.get([noop.remote() for _ in range(in_flight)])  # warm-up: workers up
        t0 = time.perf_counter()
        outstanding = [noop.remote() for _ in range(min(n, in_flight))]
        submitted = len(outstanding)
        while outstanding:
            done, outstanding = ray.wait(outstanding, num_returns=1)
            ray.get(done)
            if submitted < n:
                outstanding.append(noop.remote())
                submitted += 1
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return {
        "actions": n,
        "in_flight": in_flight,
        "wall_s": wall,
        "per_s": n / wall,
        "init_s": started,
    }


# -- over HTTP -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kb(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


async def _http_load(url: str, token: str, total: int, clients: int) -> dict[str, Any]:
    import httpx

    per = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    act: list[float] = []
    rtt: list[float] = []
    lost: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with TangramClient(url, token=token, timeout=120, limits=limits) as tg:
        envs = await asyncio.gather(
            *[tg.open_env(f"load-{i}", memory_mb=16) for i in range(clients)]
        )

        async def one_client(env: str, count: int) -> None:
            for _ in range(count):
                t = time.perf_counter()
                try:
                    r = await tg.exec(env, "true", cpu=1, timeout=30)
                except TangramError as exc:
                    lost.append(str(exc))
                    continue
                rtt.append(time.perf_counter() - t)
                if r.ok:
                    act.append(r.act_s)
                else:
                    lost.append(f"{r.status}: {r.detail}")

        t0 = time.perf_counter()
        await asyncio.gather(*[one_client(e, k) for e, k in zip(envs, per, strict=True)])
        wall = time.perf_counter() - t0
        await asyncio.gather(*[tg.close_env(e) for e in envs])
    return {
        "actions": total,
        "clients": clients,
        "ok": len(act),
        "lost": len(lost),
        "lost_examples": lost[:3],
        "wall_s": wall,
        "per_s": len(act) / wall,
        "act_p50_ms": 1e3 * _pct(act, 0.5),
        "act_p99_ms": 1e3 * _pct(act, 0.99),
        "rtt_p50_ms": 1e3 * _pct(rtt, 0.5),
        "rtt_p99_ms": 1e3 * _pct(rtt, 0.99),
    }


def _http_bench(total: int, clients: int, config: str | None) -> dict[str, Any]:
    import httpx

    port, token = _free_port(), "bench"
    cmd = [
        sys.executable,
        "-m",
        "tangram.runtime.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--shutdown-deadline",
        "5",
    ]
    if config:
        cmd += ["--config", config]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "TANGRAM_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise TangramError(f"tangram serve did not start: {proc.stderr.read()[-2000:]}")
            time.sleep(0.2)
        idle = _rss_kb(proc.pid)["VmRSS"]
        backend = httpx.get(
            url + "/v1/status", headers={"authorization": f"Bearer {token}"}
        ).json()["cpu_backend"]
        out = asyncio.run(_http_load(url, token, total, clients))
        mem = _rss_kb(proc.pid)
        out.update(
            backend=backend,
            rss_idle_mb=idle / 1024,
            rss_after_mb=mem["VmRSS"] / 1024,
            rss_peak_mb=mem["VmHWM"] / 1024,
        )
        return out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- the command ---------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tangram bench runtime", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--actions", type=int, default=10_000, help="in-process no-ops")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=100,
        help="in-process no-ops outstanding at once (both sides)",
    )
    parser.add_argument("--http-actions", type=int, default=2_000, help="execs over HTTP")
    parser.add_argument("--clients", type=int, default=100, help="concurrent HTTP clients")
    parser.add_argument("--config", help="server config for the HTTP part (default: local)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray comparison")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP load")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    ns = parser.parse_args(argv)
    report: dict[str, Any] = {"tangram": asyncio.run(_tangram_noops(ns.actions, ns.in_flight))}
    if not ns.json:
        _print_inprocess("tangram", report["tangram"])
    if not ns.no_ray:
        report["ray"] = _ray_noops(ns.actions, ns.in_flight)
        if not ns.json:
            _print_inprocess("ray", report["ray"])
        if "per_s" in report["ray"]:
            report["speedup_vs_ray"] = report["tangram"]["per_s"] / report["ray"]["per_s"]
            if not ns.json:
                print(f"  tangram / ray: {report['speedup_vs_ray']:.2f}x (goal >= 2x)")
    if not ns.no_http:
        report["http"] = _http_bench(ns.http_actions, ns.clients, ns.config)
        if not ns.json:
            _print_http(report["http"])
    if ns.json:
        print(json.dumps(report, indent=2))
    return 0


def _print_inprocess(name: str, r: dict[str, Any]) -> None:
    if "missing" in r:
        print(f"{name:>8}: {r['missing']}")
        return
    extra = (
        f" (ray.init {r['init_s']:.1f} s, not counted)"
        if "init_s" in r
        else " (exec on the sim CPU backend: full runtime path, no process)"
    )
    print(
        f"{name:>8}: {r['actions']} no-op actions, {r['in_flight']} in flight, in "
        f"{r['wall_s']:.2f} s = "
        f"{r['per_s']:,.0f}/s{extra}"
    )


def _print_http(r: dict[str, Any]) -> None:
    print(
        f"    http: {r['actions']} `true` execs ({r['backend']} backend) from {r['clients']} "
        f"clients in {r['wall_s']:.2f} s = {r['per_s']:,.0f}/s; lost {r['lost']} (goal 0)"
    )
    print(
        f"          ACT p50 {r['act_p50_ms']:.1f} ms, p99 {r['act_p99_ms']:.1f} ms; "
        f"round trip p50 {r['rtt_p50_ms']:.1f} ms, p99 {r['rtt_p99_ms']:.1f} ms"
    )
    print(
        f"          server RSS: {r['rss_idle_mb']:.0f} MiB idle, {r['rss_after_mb']:.0f} MiB "
        f"after, peak {r['rss_peak_mb']:.0f} MiB"
    )
    for example in r["lost_examples"]:
        print(f"          lost: {example}")
