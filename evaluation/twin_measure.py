"""The digital twin's measuring half (`evaluation.twin`): calibration (`calibrate`, giving a
`Profile`: each command's run time alone, its slowdown beside k copies, the environment start
and API call distributions, the client's own latency, the background load) and the real run
through `Tangram.local()`, every action traced (`measure`, giving `Observed` with its
`Done`s). `serve_api` is the mixed workload's API: a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from evaluation.twin_plan import (
    API,
    TIMEOUT_S,
    TwinParams,
    TwinTrajectory,
    reward_command,
    twin_kind,
)
from managers.cpu.request import Command
from tangram.pools import CorePool
from tangram.runtime.facade import Tangram
from topology import CpuNode


# -- the API on loopback ------------------------------------------------------------------------
def _handler(latency_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(latency_s)  # the upstream's answer time (a search, a model API)
            data = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # quiet
            pass

    return Handler


@contextlib.contextmanager
def serve_api(latency_s: float) -> Iterator[str]:
    """An HTTP API on a free loopback port answering every POST after `latency_s`; yields its
    URL and stops it on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(latency_s))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{API}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def runtime(p: TwinParams, url: str | None) -> Tangram:
    """The runtime both calibration and the run use: this machine, the API pool when the
    workload calls one (its concurrency the pool's size)."""
    if url is None:
        return Tangram.local()
    return Tangram.local(apis={API: {"url": url, "concurrency": p.api_concurrency}})


# -- the background ----------------------------------------------------------------------------
def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v[:8]) - idle, sum(v[:8])


def busy_cores(before: tuple[int, int], after: tuple[int, int], cores: int) -> float:
    """Cores busy on average between two `cpu_jiffies` readings (everyone's, ours included)."""
    d = after[1] - before[1]
    return cores * (after[0] - before[0]) / d if d > 0 else 0.0


def procs_running() -> int:
    """Threads runnable on the machine now (/proc/stat), this one included."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return int(line.split()[1])
    return 1


async def background(seconds: float = 1.0, every: float = 0.01) -> float:
    """The other tenants' runnable threads now: /proc/stat's runnable count, sampled every
    `every` seconds over `seconds` while this process runs nothing but the sampling (its own
    thread taken off). In the unit of the slowdown curve (copies at once), and unlike busy
    cores it sees a machine loaded past its cores."""
    n = max(1, round(seconds / every))
    total = 0
    for _ in range(n):
        total += procs_running() - 1
        await asyncio.sleep(every)
    return max(0.0, total / n)


# -- calibration -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """What calibration measured (each figure the median of its samples unless said):

    - `samples`: run seconds per (command, cores), the command alone on the machine;
    - `corun`: per kind and k = 1..2 x cores, its probe command's run time with k copies at
      once over its time alone in the same round (k > cores: the copies past the cores run
      outside the runtime, as other tenants' processes do), one ratio per round;
    - `opens`: environment start seconds (as the client waits them, several at once), and
      `cold_open`: the first one a fresh runtime opens (its one-time costs);
    - `api`: API call seconds as the runtime times them (several at once, up to the limit);
    - `overhead`: the client's seconds per action beyond queueing and run (its submission and
      the result's way back, an `asyncio.sleep` waking late);
    - `background`: the other tenants' runnable threads (`background`), before and after
      calibration, averaged."""

    samples: Mapping[tuple[Command, int], list[float]]
    opens: list[float]
    node: CpuNode
    dops: tuple[int, ...]
    corun: Mapping[str, Mapping[int, list[float]]]
    api: list[float]
    overhead: list[float]
    background: float = 0.0
    cold_open: float | None = None

    @property
    def run_s(self) -> dict[tuple[Command, int], float]:
        return {k: statistics.median(v) for k, v in self.samples.items()}

    @property
    def open_s(self) -> float:
        return statistics.median(self.opens)

    @property
    def api_s(self) -> float:
        return statistics.median(self.api) if self.api else 0.0

    @property
    def overhead_s(self) -> float:
        return statistics.median(self.overhead) if self.overhead else 0.0

    def slowdown(self, kind: str) -> tuple[float, ...]:
        """Per k = 1..: the kind's run time beside k - 1 copies over its time alone."""
        c = self.corun.get(kind)
        if not c:
            return (1.0,)
        return tuple(statistics.median(c[k]) for k in sorted(c))


async def _timed(tg: Tangram, env: str, cmd: Command, m: int, over: list[float]) -> float:
    t0 = time.monotonic()
    r = await tg.exec(env, cmd, cpu=m, timeout=TIMEOUT_S, kind=twin_kind(cmd))
    over.append(time.monotonic() - t0 - r.queued_s - r.run_s)
    return r.run_s


async def _api_calls(tg: Tangram, p: TwinParams, out: list[float], over: list[float]) -> None:
    for k in range(1, p.api_concurrency + 1):
        for _ in range(p.reps):
            t0 = time.monotonic()
            got = await asyncio.gather(*(tg.call_api(API, {"q": i}) for i in range(k)))
            wall = time.monotonic() - t0
            out.extend(r.run_s for r in got)
            over.extend(wall - r.queued_s - r.run_s for r in got)


async def _neighbour(cmd: Command, stop: asyncio.Event) -> None:
    """`cmd` again and again outside the runtime (on any core, as another tenant's process
    runs) until `stop`; each copy in its own process group, killed whole at the stop."""
    while not stop.is_set():
        spawn = (
            asyncio.create_subprocess_shell(cmd, **_QUIET)
            if isinstance(cmd, str)
            else asyncio.create_subprocess_exec(*cmd, **_QUIET)
        )
        proc = await spawn
        waiter, stopper = asyncio.ensure_future(proc.wait()), asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            await waiter


_QUIET = {
    "stdout": asyncio.subprocess.DEVNULL,
    "stderr": asyncio.subprocess.DEVNULL,
    "start_new_session": True,
}


async def _corun(tg: Tangram, envs: Sequence[str], cmd: Command, k: int, cores: int, over):
    """Mean run seconds of `cmd` with k copies at once: min(k, cores) through the runtime on
    one core each, the rest as neighbours outside it (`_neighbour`)."""
    stop = asyncio.Event()
    extra = [asyncio.ensure_future(_neighbour(cmd, stop)) for _ in range(k - min(k, cores))]
    try:
        got = await asyncio.gather(*(_timed(tg, e, cmd, 1, over) for e in envs[: min(k, cores)]))
    finally:
        stop.set()
        await asyncio.gather(*extra)
    return statistics.mean(got)


async def _round(tg, envs, p, tools, reward, dops, cores, prof) -> None:
    """One calibration round: every command alone, then each kind's probe (its smallest
    command) beside k - 1 copies, k = 2..2 x cores; its slowdown is the ratio to its own time
    alone in the same round (background that comes and goes shifts both alike)."""
    runs, corun, over = prof
    for cmd, m in [*((c, 1) for c in tools), *((reward, m) for m in dops)]:
        runs.setdefault((cmd, m), []).append(await _timed(tg, envs[0], cmd, m, over))
    for cmd in [*tools[:1], reward]:
        c = corun.setdefault(twin_kind(cmd), {1: []})
        alone = runs[(cmd, 1)][-1]
        c[1].append(1.0)
        for k in range(2, p.corun_max * cores + 1):
            c.setdefault(k, []).append(await _corun(tg, envs, cmd, k, cores, over) / alone)


async def calibrate(p: TwinParams, trajs: Sequence[TwinTrajectory], url: str | None) -> Profile:
    """`reps` rounds (`_round`: each command alone at each core count it may get, each kind
    beside 1..2 x cores - 1 copies), as many environments opened at once as the run opens,
    the API at 1..its limit calls at once, and the background before and after."""
    commands = sorted({s.command for t in trajs for s in t.steps if s.command}, key=str)
    reward = reward_command(p)
    tools = sorted((c for c in commands if c != reward), key=lambda c: (len(str(c)), str(c)))
    async with runtime(p, url) as tg:
        pool = tg.scheduler.pools[tg.cpu.resource]
        assert isinstance(pool, CorePool)
        name = pool.nodes()[0]
        node, cores = pool.cpu_node(name).copy(), pool.capacity(name)
        bg = [await background()]
        dops = tuple(range(1, min(p.max_dop, cores) + 1))
        opens: list[float] = []
        prof: tuple[dict, dict, list[float]] = ({}, {}, [])

        async def opened(i: int) -> str:
            t0 = time.monotonic()
            env = await tg.open_env(f"calibrate{i}")
            opens.append(time.monotonic() - t0)
            return env

        first = await opened(0)  # the runtime's first environment: its one-time costs
        cold = opens.pop()
        rest = await asyncio.gather(*(opened(i) for i in range(1, len(trajs) + cores)))
        envs = [first, *rest]
        for _ in range(p.reps):
            await _round(tg, envs, p, tools, reward, dops, cores, prof)
        api: list[float] = []
        if url is not None:
            await _api_calls(tg, p, api, prof[2])
        for env in envs:
            await tg.close_env(env)
        bg.append(await background())
    runs, corun, over = prof
    return Profile(runs, opens, node, dops, corun, api, over, statistics.mean(bg), cold)


# -- the real run ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Done:
    """One action of the real run: what it ran, with what, and when (seconds from the batch's
    start). `gap`: from the trajectory's previous result (its environment's opening, for the
    first) to this submission: the LLM gap as the client really waited it. `command` None: an
    API call."""

    command: Command | None
    elastic: bool
    cores: int
    submitted: float
    gap: float
    queued_s: float
    run_s: float


@dataclass(frozen=True)
class Observed:
    acts: list[float]  # ACT (queued + run) of every action
    runs: list[float]  # run time (start to end) of every action
    busy: float  # granted core-seconds
    step_s: float  # batch start to the last action's end
    cores: int
    trace: Mapping[str, tuple[float, tuple[Done, ...]]] | None = None  # real run: per trajectory
    # its start (the opening of its environment) and its actions
    background: float | None = None  # real run: cores busy beyond its grants (other tenants
    # and the runtime's own work) during it


async def _step(tg: Tangram, env: str, s, dops: tuple[int, ...]):
    if s.command is None:
        return await tg.call_api(API, {"q": env})
    cpu = (dops[0], dops[-1]) if s.elastic and len(dops) > 1 else 1
    return await tg.exec(
        env, s.command, cpu=cpu, elastic=s.elastic, timeout=TIMEOUT_S, kind=twin_kind(s.command)
    )


async def measure(
    p: TwinParams, trajs: Sequence[TwinTrajectory], dops: tuple[int, ...], url: str | None
) -> Observed:
    """The workload for real through `Tangram.local()`, every action traced (`Done`)."""
    trace: dict[str, tuple[float, tuple[Done, ...]]] = {}
    async with runtime(p, url) as tg:
        cores = tg.scheduler.pools[tg.cpu.resource].capacity()
        j0, t0 = cpu_jiffies(), time.monotonic()

        async def trajectory(t: TwinTrajectory) -> None:
            await asyncio.sleep(max(0.0, t0 + t.start - time.monotonic()))
            start = time.monotonic() - t0
            env = await tg.open_env(t.id)
            done, last = [], start
            for s in t.steps:
                await asyncio.sleep(s.think_s)
                submitted = time.monotonic() - t0
                r = await _step(tg, env, s, dops)
                units = r.units.get(tg.cpu.resource, 0)
                done.append(
                    Done(
                        s.command,
                        s.elastic,
                        units,
                        submitted,
                        submitted - last,
                        r.queued_s,
                        r.run_s,
                    )
                )
                last = submitted + r.queued_s + r.run_s  # its end, as the runtime timed it
            trace[t.id] = (start, tuple(done))
            await tg.close_env(env)

        await asyncio.gather(*(trajectory(t) for t in trajs))
        used = busy_cores(j0, cpu_jiffies(), cores)
    ds = [d for _, dd in trace.values() for d in dd]
    busy = sum(d.cores * d.run_s for d in ds)
    step_s = max(d.submitted + d.queued_s + d.run_s for d in ds)
    return Observed(
        [d.queued_s + d.run_s for d in ds],
        [d.run_s for d in ds],
        busy,
        step_s,
        cores,
        trace,
        max(0.0, used - busy / step_s),
    )
