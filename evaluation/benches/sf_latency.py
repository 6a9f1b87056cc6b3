"""`tangram bench sandboxfusion --latency`: `/run_code` latency and throughput, same run.

Servers, each its own process on loopback, all up for the whole run; their latencies measured
interleaved request by request (A, B, C, A, ...: a drift of the machine's speed, 2-3x from day
to day here, falls on every server alike), their throughputs one after another in each round:

- `minimal`: a no-sandbox FastAPI server (`sf_minimal`, a few lines): the floor, what HTTP plus
  running the program costs;
- `SandboxFusion-shaped`: a no-sandbox server doing per request what SandboxFusion's runner
  does with `isolation: none` (`sf_shaped`: its models, a fresh temporary folder, the code in a
  file, bash through asyncio's subprocess, `fetch_files`, a log line): the reference the goals
  are held against (latency <= 1.0x, 16-client throughput >= 0.9x);
- `SF-shaped, 1 run per core`: the same with at most one program per core at a time, as Tangram
  grants whole cores (on a machine shared with other work, 16 programs at once take a larger
  share of it than 2 do: this one compares like with like);
- `tangram`: `tangram serve` (this machine's best CPU backend: bwrap where it runs) with its
  warm pool of never-used sandboxes;
- `tangram, no warm pool`: the same with `TANGRAM_SANDBOXFUSION_WARM=0` (a sandbox opened per
  request on its path);
- `tangram, rootless`: `tangram serve` run as root starts it as the unprivileged user of
  `.ci/rootless.sh` (`as_user`: the bwrap backend with subordinate uids and a delegated cgroup
  subtree), beside root's; goal: its latency and throughput within 1.2x of root's `tangram`.

Figures: the raw program (`python3 main.py` by `subprocess.run`; the servers and the raw run
all find `python3` on the sandbox's fixed PATH: one interpreter), each server's median and p90
latency for `print(1)` one request at a time, its requests per second with `--clients` (16)
concurrent clients, how many of 10 `print(1)` requests with `run_timeout` 0.05 s succeed, and
the ratios against `SandboxFusion-shaped` and `minimal`. Real SandboxFusion's server is not on
the package registries (only its SDK is), so it cannot be installed here: `SandboxFusion-shaped`
stands in for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from evaluation.benches import as_user
from managers.cpu.grant import SAFE_PATH

PRINT = {"code": "print(1)", "language": "python"}
MINIMAL = "minimal (no sandbox)"
SHAPED = "SandboxFusion-shaped"
PER_CORE = "SF-shaped, 1 run per core"
ROOTLESS = "tangram, rootless"
# `tangram serve`, started from the module (works from a source checkout, whatever entry points
# the installed metadata lists)
SERVE = (
    sys.executable,
    "-c",
    "import sys; from tangram.runtime.server import main; sys.exit(main(sys.argv[1:]))",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """CPU time of a server: its own, and that of everything it ran. The programs a server
    without sandboxes runs are its children, waited for (/proc/<pid>/stat); Tangram's run
    inside sandboxes that outlive a request (its warm pool resets and reuses them), so for
    it the CPU of its cgroups (`tangram-<pid>-*`: every sandbox, its init and spawner, and
    every command) is added to its own, and its children's are left out (a closed
    sandbox's are in its cgroup already)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    tops = _cgroups_of(pid)
    if not tops:
        return sum(int(v) for v in fields[11:15]) / tick
    return sum(int(v) for v in fields[11:13]) / tick + sum(_cgroup_cpu(t) for t in tops)


def _cgroups_of(pid: int) -> list[str]:
    """The CPU-accounting folders of the cgroup trees server `pid` made (v1 cpuacct, or v2)."""
    found = []
    for root in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup"):
        for depth in range(4):
            found += glob.glob(f"{root}/{'*/' * depth}tangram-{pid}-*")
        if found:
            return found
    return found


def _cgroup_cpu(folder: str) -> float:
    try:
        with open(f"{folder}/cpuacct.usage") as f:
            return int(f.read()) / 1e9
    except FileNotFoundError:
        with open(f"{folder}/cpu.stat") as f:
            usage = dict(line.split() for line in f)
        return int(usage.get("usage_usec", 0)) / 1e6


@contextmanager
def _server(argv: list[str], env: dict[str, str]) -> Iterator[tuple[str, int]]:
    port = _free_port()
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"{argv} exited: {err[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not start")
            time.sleep(0.2)
        yield url, _served_by(proc.pid) if argv[0] == "runuser" else proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _served_by(pid: int) -> int:
    """The server `runuser` started (its one child), whose CPU and cgroups are counted."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return pid
    return children[0] if children else pid


def _raw_ms(n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "main.py"), "w") as f:
            f.write(PRINT["code"])
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(
                ["python3", "main.py"],
                cwd=d,
                capture_output=True,
                check=True,
                env={"PATH": SAFE_PATH},
            )
            samples.append((time.perf_counter() - t) * 1e3)
    return samples


async def _interleaved(urls: dict[str, str], n: int) -> tuple[dict[str, list[float]], dict]:
    """`n` `print(1)` requests to each server, one at a time, taking the servers in turn
    request by request (server A, B, C, A, ...): a drift of the machine's speed during the
    round falls on every server alike. Returns each server's latencies and right answers."""
    samples: dict[str, list[float]] = {k: [] for k in urls}
    ok = dict.fromkeys(urls, 0)
    clients = {k: httpx.AsyncClient(base_url=u, timeout=120) for k, u in urls.items()}
    try:
        for http in clients.values():
            await http.post("/run_code", json=PRINT)  # warm up
        for _ in range(n):
            for name, http in clients.items():
                t = time.perf_counter()
                d = (await http.post("/run_code", json=PRINT)).json()
                samples[name].append((time.perf_counter() - t) * 1e3)
                ok[name] += d.get("status") == "Success" and d["run_result"]["stdout"] == "1\n"
                await asyncio.sleep(0.02)  # a warm pool refills between requests, as in use
    finally:
        for http in clients.values():
            await http.aclose()
    return samples, ok


async def _throughput(url: str, clients: int, seconds: float) -> tuple[float, int, int]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        done = ok = 0
        stop = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done, ok
            while time.perf_counter() < stop:
                d = (await http.post("/run_code", json=PRINT)).json()
                done += 1
                ok += d.get("status") == "Success"

        t = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return done / (time.perf_counter() - t), ok, done


async def _tight(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        ok = 0
        for _ in range(10):
            d = (await http.post("/run_code", json={**PRINT, "run_timeout": 0.05})).json()
            ok += d.get("status") == "Success"
            await asyncio.sleep(0.05)
        return ok


def _table(
    servers: dict,
    lat: dict[str, list[float]],
    rps: dict[str, list[float]],
    ok: dict[str, list[int]],
    done: dict[str, int],
    raw: list[float],
    clients: int,
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    ref, ref_rps = statistics.median(lat[SHAPED]), statistics.median(rps[SHAPED])
    core_rps = statistics.median(rps[PER_CORE])
    base, base_rps = statistics.median(lat[MINIMAL]), statistics.median(rps[MINIMAL])
    print(f"{'raw python3 main.py':28s} median {statistics.median(raw):7.1f} ms")
    head = f"req/s @{clients}"
    print(
        f"{'server':28s} {'median':>8s} {'p90':>8s} {'x SF':>6s} {'x min':>6s} {head:>10s}"
        f" {'x SF':>6s} {'x 1/core':>8s} {'x min':>6s} {'ok':>9s} {'tput ok':>7s}"
        f" {'0.05s ok':>8s}"
    )
    for name in servers:
        s = sorted(lat[name])
        med, p90 = statistics.median(s), s[int(0.9 * (len(s) - 1))]
        tput = statistics.median(rps[name])
        figures[name] = {"median_ms": med, "p90_ms": p90, "rps": tput}
        print(
            f"{name:28s} {med:6.1f}ms {p90:6.1f}ms {med / ref:5.2f}x {med / base:5.2f}x "
            f"{tput:10.1f} {tput / ref_rps:5.2f}x {tput / core_rps:7.2f}x "
            f"{tput / base_rps:5.2f}x "
            f"{ok[name][0]:>4d}/{ok[name][1]:<4d} {ok[name][2] / max(done[name], 1):6.0%} "
            f"{ok[name][3]:>5d}/10"
        )
    return figures


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram bench sandboxfusion --latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--latency", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("-n", "--requests", type=int, default=40, help="sequential, per round (40)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=8.0, help="throughput phase, per round")
    p.add_argument("--no-cold", action="store_true", help="leave out `tangram, no warm pool`")
    return p


def _servers(no_cold: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The servers measured: each one's command line and what it adds to the environment."""
    py = sys.executable
    servers = {
        # the sandbox's PATH, so that every server runs the same python3
        MINIMAL: ([py, "-m", "evaluation.benches.sf_minimal"], {"PATH": SAFE_PATH}),
        SHAPED: ([py, "-m", "evaluation.benches.sf_shaped"], {"PATH": SAFE_PATH}),
        PER_CORE: (
            [py, "-m", "evaluation.benches.sf_shaped", "--runs-per-core"],
            {"PATH": SAFE_PATH},
        ),
        "tangram": ([*SERVE, "--log-level", "warning"], {}),
        "tangram, no warm pool": (
            [*SERVE, "--log-level", "warning"],
            {"TANGRAM_SANDBOXFUSION_WARM": "0"},
        ),
    }
    if no_cold:
        del servers["tangram, no warm pool"]
    rootless = as_user.command()
    if isinstance(rootless, str):
        print(f"tangram, rootless: not measured ({rootless})")
    else:
        servers[ROOTLESS] = ([*rootless, *SERVE[1:], "--log-level", "warning"], {})
    return servers


@dataclass
class Measured:
    """What the rounds measured, per server (and the raw program's latencies)."""

    names: list[str]
    lat: dict[str, list[float]] = field(init=False)  # sequential latencies, ms
    rps: dict[str, list[float]] = field(init=False)  # throughput per round
    ok: dict[str, list[int]] = field(init=False)  # seq ok, seq n, tput ok, tight ok
    cpu: dict[str, list[float]] = field(init=False)  # CPU ms per request, throughput
    done: dict[str, int] = field(init=False)  # throughput requests answered
    raw: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lat = {k: [] for k in self.names}
        self.rps = {k: [] for k in self.names}
        self.ok = {k: [0, 0, 0, 0] for k in self.names}
        self.cpu = {k: [] for k in self.names}
        self.done = {k: 0 for k in self.names}


def _round(up: dict[str, tuple[str, int]], ns: argparse.Namespace, m: Measured, first: bool):
    """One round: the raw program, every server's latency interleaved request by request,
    then each server's throughput and its CPU per request (and, in the first round, how many
    requests with a tight timeout it answers)."""
    m.raw += _raw_ms(ns.requests)
    samples, good = asyncio.run(_interleaved({k: u for k, (u, _) in up.items()}, ns.requests))
    for name, (url, pid) in up.items():
        m.lat[name] += samples[name]
        m.ok[name][0] += good[name]
        m.ok[name][1] += len(samples[name])
        c0 = cpu_seconds(pid)
        tput, tgood, answered = asyncio.run(_throughput(url, ns.clients, ns.seconds))
        time.sleep(1.0)  # the last sandboxes closed (and waited for)
        m.cpu[name].append((cpu_seconds(pid) - c0) * 1e3 / max(answered, 1))
        m.rps[name].append(tput)
        m.ok[name][2] += tgood
        m.done[name] += answered
        if first:
            m.ok[name][3] = asyncio.run(_tight(url))


def _report(servers: dict, m: Measured, clients: int) -> None:
    figures = _table(servers, m.lat, m.rps, m.ok, m.done, m.raw, clients)
    if ROOTLESS in figures and "tangram" in figures:
        root, rl = figures["tangram"], figures[ROOTLESS]
        lat, rps = rl["median_ms"] / root["median_ms"], root["rps"] / max(rl["rps"], 1e-9)
        verdict = "met" if max(lat, rps) <= 1.2 else "MISSED"
        print(
            f"rootless vs root (tangram): latency {lat:.2f}x, throughput {1 / rps:.2f}x "
            f"(goal: within 1.2x: {verdict})"
        )
    print(
        "CPU per request under load (the server process and what it ran: its programs, or "
        "for tangram its cgroups, every sandbox and command): "
        + "; ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in m.cpu.items())
    )
    print(
        "real SandboxFusion: its server is not on the package registries (only the SDK, "
        "sandbox-fusion), so it is not measured here; `SandboxFusion-shaped` stands in"
    )


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    servers = _servers(ns.no_cold)
    m = Measured(list(servers))
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with contextlib.ExitStack() as stack:
        # every server up at once, idle while another is measured
        up = {name: stack.enter_context(_server(cmd, env)) for name, (cmd, env) in servers.items()}
        for r in range(ns.rounds):
            _round(up, ns, m, first=r == 0)
            print(f"round {r + 1}/{ns.rounds} done (load average {os.getloadavg()[0]:.2f})")
    _report(servers, m, ns.clients)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0
