"""Lifecycle on this machine's real CPU backend (`Tangram.local()`: cgroup as root, else
affinity): graceful shutdown stops admitting, cancels queued actions, kills running ones past
the deadline, closes environments, and leaves no cgroup folder or child process; idle
environments are reclaimed; `tangram serve` does the same on SIGTERM."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tangram.errors import ShuttingDown, TangramError
from tangram.runtime.facade import Tangram


def marker() -> str:
    return f"tangram-test-{uuid.uuid4().hex[:12]}"


def processes_with(text: str) -> list[int]:
    """Live processes whose command line holds `text` (zombies are already gone)."""
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            data = Path(cmdline).read_bytes()
            state = Path(cmdline).with_name("stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in data and state != "Z":
            found.append(int(cmdline.split("/")[2]))
    return found


def cgroup_leftovers(tg: Tangram) -> list[str]:
    """The backend's cgroup folders still on disk (none unless it is the cgroup backend)."""
    h = getattr(tg.cpu.backend, "h", None)
    return [str(p) for p in (h.distinct() if h is not None else []) if p.is_dir()]


def env_cgroups(env_id: str) -> list[str]:
    return glob.glob(f"/sys/fs/cgroup/**/tangram-*/{env_id}", recursive=True)


def gone_within(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_shutdown_cancels_queued_kills_late_and_leaves_nothing() -> None:
    mark = marker()

    async def scenario() -> None:
        tg = await Tangram.local().start()
        cores = tg.status().pools["cpu"].capacity
        env = await tg.open_env("traj-1", memory_mb=256)
        workdir = tg.cpu.envs.get(env).workdir
        running = asyncio.create_task(tg.exec(env, f"sleep 30; echo {mark}", cpu=cores, timeout=60))
        while tg.status().running == 0:
            await asyncio.sleep(0.02)
        queued = asyncio.create_task(tg.exec(env, f"echo {mark}", cpu=1, timeout=60))
        await asyncio.sleep(0.1)
        assert tg.status().queue == 1
        assert processes_with(mark)
        t0 = time.monotonic()
        await tg.shutdown(deadline=0.5)
        assert time.monotonic() - t0 < 10
        assert (await queued).status == "cancelled"
        assert (await running).status == "cancelled"
        with pytest.raises(ShuttingDown):
            await tg.open_env("traj-2")
        with pytest.raises(ShuttingDown):
            await tg.exec(env, "true")
        assert tg.status().envs == 0
        assert not os.path.exists(workdir)
        assert cgroup_leftovers(tg) == []
        await tg.shutdown()  # idempotent

    asyncio.run(scenario())
    assert gone_within(lambda: processes_with(mark), 2.0), processes_with(mark)


def test_shutdown_lets_running_actions_finish_within_the_deadline() -> None:
    async def scenario() -> None:
        tg = await Tangram.local().start()
        env = await tg.open_env("traj-1", memory_mb=256)
        task = asyncio.create_task(tg.exec(env, "sleep 0.3; echo done", timeout=30))
        while tg.status().running == 0:
            await asyncio.sleep(0.02)
        await tg.shutdown(deadline=10)
        r = await task
        assert r.ok and r.stdout == "done\n"
        assert cgroup_leftovers(tg) == []

    asyncio.run(scenario())


def test_idle_environments_are_reclaimed_busy_ones_kept() -> None:
    async def scenario() -> None:
        async with Tangram.local(idle_env_s=1.0) as tg:
            # the busy one's command starts right after its open (on a loaded machine a step
            # in between can itself take longer than idle_env_s), and outlasts idle_env_s
            busy = await tg.open_env("busy", memory_mb=128)
            running = asyncio.ensure_future(tg.exec(busy, "sleep 3", timeout=30))
            idle = await tg.open_env("idle", memory_mb=128)
            assert (await tg.exec(idle, "true")).ok
            r = await running
            assert r.ok, r  # its environment was not reclaimed under it
            assert tg.cpu.envs.record(busy) is not None or tg.status().envs <= 1
            # reclaimed: gone from the table at once, its cgroups removed by the close that
            # follows (off the event loop), so both are waited for
            for _ in range(200):
                if tg.status().envs == 0 and not env_cgroups(idle) + env_cgroups(busy):
                    break
                await asyncio.sleep(0.05)
            assert tg.status().envs == 0
            assert env_cgroups(idle) == [] and env_cgroups(busy) == []
            with pytest.raises(TangramError):
                await tg.exec(idle, "true")

    asyncio.run(scenario())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_stops_gracefully_on_sigterm() -> None:
    """`tangram serve` with a running action and a queued one: SIGTERM ends it within the
    deadline, the running command's processes are killed, every environment is closed."""
    mark = marker()
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tangram.runtime.cli",
            "serve",
            "--port",
            str(port),
            "--shutdown-deadline",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TANGRAM_TOKEN": "t0k"},
    )
    base = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=base, headers={"authorization": "Bearer t0k"}, timeout=30)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        env = http.post("/v1/envs", json={"trajectory": "t", "memory_mb": 128}).json()["env_id"]
        cores = http.get("/v1/status").json()["pools"]["cpu"]["capacity"]
        answers: list = []

        def call(body: dict) -> None:
            try:
                answers.append(http.post(f"/v1/envs/{env}/exec", json=body).json())
            except (httpx.HTTPError, ValueError) as exc:
                answers.append({"status": repr(exc)})

        threads = [
            threading.Thread(target=call, args=(b,))
            for b in (
                {"command": f"sleep 30; echo {mark}", "cpu": cores, "timeout": 60},
                {"command": f"echo {mark}", "cpu": 1},
            )
        ]
        for t in threads:
            t.start()
            time.sleep(0.3)
        assert gone_within(lambda: not processes_with(mark), 5)
        assert env_cgroups(env) or not os.path.isdir("/sys/fs/cgroup/cpu")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        assert time.monotonic() - t0 < 15
        assert rc in (0, -signal.SIGTERM), rc  # uvicorn re-raises the signal once drained
        for t in threads:
            t.join(10)
        statuses = sorted(a["status"] for a in answers)  # each answered with its result
        assert statuses == ["cancelled", "cancelled"], answers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        http.close()
    assert gone_within(lambda: processes_with(mark), 2.0), processes_with(mark)
    assert env_cgroups(env) == []
