"""`tangram bench sessions`: a shell session's command latency and many sessions' throughput,
through `tangram serve` (bwrap: each session in its environment's sandbox, each command one
action) against SWE-ReX's own server (`swerex-remote`: its sessions on the host, no sandbox, no
scheduler), both started in this run and driven by the same client, SWE-ReX's
`RemoteRuntime`.

Latency: `run_in_session("echo hi")`, one at a time, the two servers alternating request by
request (so both see the same machine state); median and p99. Throughput: `--sessions`
sessions (each in its own environment on ours, all on one server on theirs) each running
`echo hi` in a loop for `--seconds`; commands per second and failures. Goal: our median within
1.2x of swerex-remote's, 0 failures. Needs root and bubblewrap (the bwrap backend).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from managers.cpu.backends.bwrap.backend import BwrapBackend

TOKEN = "bench-sessions"
SERVE = (
    sys.executable,
    "-c",
    "import sys; from tangram.runtime.server import main; sys.exit(main(sys.argv[1:]))",
)


def unavailable() -> str | None:
    """Why this bench cannot run here, or None."""
    try:
        import swerex.runtime.remote  # noqa: F401 (the client both servers are driven by)
    except ImportError:
        return "swe-rex is not installed (pip install 'arl-tangram[test]')"
    if shutil.which("swerex-remote") is None:
        return "swerex-remote (swe-rex's server) is not on the PATH"
    if os.geteuid() != 0:
        return "needs root (the bwrap backend)"
    return BwrapBackend.probe()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _process(argv: list[str], url: str, env: dict[str, str]) -> Iterator[None]:
    """Run a server until the block ends; its output goes to a file (a pipe nobody read would
    fill and stop it), whose tail is printed where the server failed."""
    log = tempfile.NamedTemporaryFile(prefix="bench-sessions-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                with open(log.name, errors="replace") as f:
                    raise RuntimeError(f"{argv[0]} exited: {f.read()[-2000:]}")
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[0]} did not start in 120 s") from None
                time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        with open(log.name, errors="replace") as f:
            text = f.read()
        if "Traceback" in text:
            print(f"{argv[0]}'s log ({log.name}) holds a traceback:\n{text[-3000:]}")
        else:
            os.unlink(log.name)


@contextmanager
def servers(state: str) -> Iterator[tuple[str, str]]:
    """(ours, theirs): the base URLs of `tangram serve` and `swerex-remote`, both running."""
    ours, theirs = _port(), _port()
    config = os.path.join(state, "tangram.yaml")
    with open(config, "w") as f:
        f.write("cpu: {backend: bwrap}\n")
    tangram = [*SERVE, "--config", config, "--port", str(ours), "--token", TOKEN]
    swerex = ["swerex-remote", "--port", str(theirs), "--auth-token", TOKEN]
    env = {**os.environ, "TMPDIR": state}
    with (
        _process([*tangram, "--log-level", "warning"], f"http://127.0.0.1:{ours}/healthz", env),
        _process(swerex, f"http://127.0.0.1:{theirs}/", env),
    ):
        yield f"http://127.0.0.1:{ours}", f"http://127.0.0.1:{theirs}"


def _env(url: str, trajectory: str) -> str:
    r = httpx.post(
        f"{url}/v1/envs",
        json={"trajectory": trajectory, "memory_mb": 64},
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=120,
    )
    r.raise_for_status()
    return r.json()["env_id"]


def _runtime(host: str):
    from swerex.runtime.remote import RemoteRuntime  # (checked by `unavailable`)

    return RemoteRuntime(host=host, port=None, auth_token=TOKEN)


async def latency(ours: str, theirs: str, n: int) -> dict[str, list[float]]:
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

    sides = {"tangram": _runtime(f"{ours}/swerex/{_env(ours, 'lat')}"), "swerex": _runtime(theirs)}
    for rt in sides.values():
        await rt.create_session(CreateBashSessionRequest(session="lat"))
    times: dict[str, list[float]] = {k: [] for k in sides}
    for i in range(n + 5):
        for name, rt in sides.items():
            t0 = time.perf_counter()
            obs = await rt.run_in_session(BashAction(command="echo hi", session="lat"))
            if i >= 5:  # warm-up
                times[name].append(time.perf_counter() - t0)
            assert obs.output.strip() == "hi", obs
    for rt in sides.values():
        await rt.close()
    return times


async def throughput(host_of: list[str], seconds: float) -> tuple[int, int]:
    """(commands done, failures) of one session per host, each looping `echo hi` for
    `seconds` once every session is open (opening them is not counted)."""
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

    runtimes = [_runtime(h) for h in host_of]
    await asyncio.gather(
        *(
            rt.create_session(CreateBashSessionRequest(session=f"s{i}"))
            for i, rt in enumerate(runtimes)
        )
    )
    deadline = time.monotonic() + seconds
    done = failed = 0

    async def one(i: int, rt) -> None:
        nonlocal done, failed
        while time.monotonic() < deadline:
            try:
                obs = await rt.run_in_session(BashAction(command="echo hi", session=f"s{i}"))
                ok = obs.output.strip() == "hi"
            except Exception:
                ok = False
            done += ok
            failed += not ok

    await asyncio.gather(*(one(i, rt) for i, rt in enumerate(runtimes)))
    return done, failed


def idle(n: int, state: str) -> None:
    """Open `n` sessions (at most `PER_ENV` per environment) on `tangram serve` under
    RLIMIT_NOFILE 1024, then print the server's descriptors and the memory of the sessions'
    processes (PSS: their shared pages split among them), per idle session."""
    port = _port()
    config = os.path.join(state, "idle.yaml")
    with open(config, "w") as f:
        f.write("cpu: {backend: bwrap}\n")
    argv = ["prlimit", "--nofile=1024:1024", *SERVE, "--config", config, "--port", str(port)]
    argv += ["--token", TOKEN, "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TMPDIR": state}
    with _process(argv, f"{url}/healthz", env):
        server = _server_pid(port)
        before = len(os.listdir(f"/proc/{server}/fd"))
        t0 = time.monotonic()
        opened, failed = asyncio.run(_open_idle(url, n))
        took = time.monotonic() - t0
        fds = len(os.listdir(f"/proc/{server}/fd"))
        pss, procs = _session_pss()
        ok = asyncio.run(_touch(url, opened[:: max(1, len(opened) // 50)]))
    print(
        f"{len(opened)} idle sessions opened in {took:.1f} s ({failed} failed), "
        f"server under RLIMIT_NOFILE 1024:"
    )
    print(f"  server descriptors: {before} before, {fds} with every session open")
    print(
        f"  session processes: {procs} (host + bash each), PSS {pss / 2**20:.0f} MiB in all, "
        f"{pss / max(1, len(opened)) / 2**20:.2f} MiB per idle session"
    )
    print(f"  a command in {ok[1]} of them afterwards: {ok[0]} answered")


PER_ENV = 60  # sessions per environment in the idle measurement (the limit is 64)


def _server_pid(port: int) -> int:
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True)
    return int(out.stdout.split("pid=")[1].split(",")[0])


async def _open_idle(url: str, n: int) -> tuple[list[tuple[str, str]], int]:
    h = {"authorization": f"Bearer {TOKEN}"}
    opened: list[tuple[str, str]] = []
    failed = 0
    async with httpx.AsyncClient(base_url=url, headers=h, timeout=300) as c:
        for e in range((n + PER_ENV - 1) // PER_ENV):
            r = await c.post("/v1/envs", json={"trajectory": f"idle-{e}", "memory_mb": 1024})
            r.raise_for_status()
            env = r.json()["env_id"]
            names = [f"s{i}" for i in range(min(PER_ENV, n - len(opened) - failed))]
            for k in range(0, len(names), 8):  # 8 at a time
                rs = await asyncio.gather(
                    *(
                        c.post(f"/v1/envs/{env}/sessions", json={"name": s})
                        for s in names[k : k + 8]
                    )
                )
                for s, r in zip(names[k : k + 8], rs):
                    if r.status_code == 200:
                        opened.append((env, s))
                    else:
                        failed += 1
    return opened, failed


async def _touch(url: str, sessions: list[tuple[str, str]]) -> tuple[int, int]:
    h = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=h, timeout=120) as c:
        rs = await asyncio.gather(
            *(c.post(f"/v1/envs/{e}/sessions/{s}/run", json={"command": "echo hi"})
              for e, s in sessions)
        )  # fmt: skip
    return sum(r.status_code == 200 and r.json()["stdout"] == "hi\n" for r in rs), len(rs)


def _session_pss() -> tuple[int, int]:
    """(bytes of PSS, processes) of every session host and its shell."""
    total = count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            host = b"tangram_session_host.py" in cmd
            shell = cmd.startswith(b"bash\0--noprofile\0--norc\0--noediting")
            if not (host or shell):
                continue
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
            count += 1
        except OSError:
            continue
    return total, count


def _ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tangram bench sessions", description=__doc__)
    p.add_argument("-n", "--requests", type=int, default=200, help="sequential, per server")
    p.add_argument("--sessions", type=int, default=100, help="concurrent sessions (100)")
    p.add_argument("--seconds", type=float, default=10.0, help="throughput phase (10 s)")
    p.add_argument(
        "--idle",
        type=int,
        default=0,
        help="instead: open N idle sessions under RLIMIT_NOFILE 1024; descriptors, memory",
    )
    args = p.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"tangram bench sessions: cannot run here: {why}")
        return 1
    state = tempfile.mkdtemp(prefix="tangram-bench-sessions-")
    if args.idle:
        idle(args.idle, state)
        return 0
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with servers(state) as (ours, theirs):
        times = asyncio.run(latency(ours, theirs, args.requests))
        envs = [_env(ours, f"tp-{i}") for i in range(args.sessions)]
        t_done, t_failed = asyncio.run(
            throughput([f"{ours}/swerex/{e}" for e in envs], args.seconds)
        )
        s_done, s_failed = asyncio.run(throughput([theirs] * args.sessions, args.seconds))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"run_in_session('echo hi'), {args.requests} one at a time, alternating servers:")
    for name, v in times.items():
        print(f"  {name:<8} median {med[name]:6.2f} ms   p99 {_ms(v, 0.99):6.2f} ms")
    ratio = med["tangram"] / med["swerex"]
    print(f"  tangram / swerex-remote median: {ratio:.2f}x (goal <= 1.2x)")
    print(f"{args.sessions} sessions at once for {args.seconds:g} s (echo hi in a loop):")
    print(f"  tangram  {t_done / args.seconds:7.1f} commands/s, {t_failed} failed")
    print(f"  swerex   {s_done / args.seconds:7.1f} commands/s, {s_failed} failed")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    met = ratio <= 1.2 and t_failed == 0
    print(f"goal: {'met' if met else 'NOT met'}")
    return 0
