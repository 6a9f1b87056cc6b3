"""`tangram bench env`: environments from images, fork and snapshot, against `cp -a` of the
same files, in the same run (bwrap backend: root, overlayfs, loop devices).

Figures (median of --repeat, milliseconds): open an environment from a warm image; fork a
group (1 and --group children) of a parent that has written nothing and one that has written
--mb MB (in 1 MB files); snapshot the same two; and, as the reference a copy-based design pays
per sample, `cp -a` of the parent's whole tree (image + written files) on the same disk, and of
its written files alone; where a Docker engine runs, the same image imported into it: `docker
run`, `docker commit` of a container that wrote --mb MB and `docker run` of that commit. A fork
or snapshot is O(1) in data: its rows should not grow with --mb.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time

from evaluation.benches import env_healthz
from managers.cpu import CpuManager
from managers.cpu.build import build
from managers.cpu.images import ImageStore
from managers.cpu.request import ExecRequest

TOOLS = ("sh", "cat", "ls", "dd", "rm", "sync", "mkdir", "seq", "sleep")


def _ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


async def _bench(state: str, repeat: int, group: int, mb: int) -> dict[str, float]:
    m = CpuManager("bwrap", state_dir=state)
    await m.start()
    assert m.roots is not None
    build(
        m.roots.images,
        "bench-tools",
        [{"host": {"programs": list(TOOLS), "folders": ["/usr/lib/python3"]}}],
    )
    figures: dict[str, list[float]] = {}

    def add(key: str, t0: float) -> None:
        figures.setdefault(key, []).append(time.perf_counter() - t0)

    n = 0
    try:
        for _ in range(repeat):
            for size in (0, mb):
                n += 1
                t = time.perf_counter()
                parent = await m.open_env(
                    f"b-{n}", 64, image="bench-tools", disk_mb=max(64, 2 * mb)
                )
                add("open from a warm image", t)
                if size:
                    fill = (
                        f"set -e; mkdir -p /sandbox/d; for i in $(seq {size}); do dd "
                        f"if=/dev/zero of=/sandbox/d/f$i bs=1M count=1 status=none; done; "
                        f"sync"
                    )
                    r = await m.execute(ExecRequest(parent, fill, timeout=600))
                    assert r.ok, r
                tag = f"{size} MB written"
                t = time.perf_counter()
                kids = await m.fork_env(parent, [f"b-{n}-k0"])
                add(f"fork x1, {tag}", t)
                t = time.perf_counter()
                kids += await m.fork_env(parent, [f"b-{n}-g{i}" for i in range(group)])
                add(f"fork x{group}, {tag}", t)
                t = time.perf_counter()
                sid = await m.snapshot(parent)
                add(f"snapshot, {tag}", t)
                root = m.envs.record(parent).rooted.target
                with tempfile.TemporaryDirectory(dir=state) as d:
                    t = time.perf_counter()
                    subprocess.run(["cp", "-a", f"{root}/.", f"{d}/all"], check=True)
                    add(f"cp -a of the whole tree, {tag}", t)
                    if size:
                        t = time.perf_counter()
                        subprocess.run(["cp", "-a", f"{root}/sandbox/d", f"{d}/data"], check=True)
                        add(f"cp -a of the written files, {tag}", t)
                for e in [parent, *kids]:
                    await m.close_env(e)
                await m.delete_snapshot(sid)
    finally:
        await m.close()
    return {k: _ms(v) for k, v in figures.items()}


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _bench_docker(rootfs: str, repeat: int, mb: int) -> dict[str, float]:
    """The same image imported into the Docker engine: `docker run` (open), `docker commit`
    of a container that wrote `mb` MB (snapshot) and `docker run` of the commit (one fork)."""
    tar = subprocess.Popen(["tar", "-C", rootfs, "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(
        ["docker", "import", "-", "tangram-bench-env:latest"],
        stdin=tar.stdout,
        check=True,
        capture_output=True,
    )
    tar.wait()
    figures: dict[str, list[float]] = {}
    try:
        for i in range(repeat):
            t = time.perf_counter()
            c = _docker(
                "run", "-d", "--network", "none", "tangram-bench-env:latest", "sleep", "1000000"
            )
            figures.setdefault("docker run (open)", []).append(time.perf_counter() - t)
            _docker(
                "exec",
                c,
                "sh",
                "-c",
                f"mkdir -p /d; for i in $(seq {mb}); do dd "
                f"if=/dev/zero of=/d/f$i bs=1M count=1 status=none; done; sync",
            )
            t = time.perf_counter()
            _docker("commit", c, f"tangram-bench-env:c{i}")
            figures.setdefault(f"docker commit, {mb} MB written", []).append(
                time.perf_counter() - t
            )
            t = time.perf_counter()
            k = _docker(
                "run", "-d", "--network", "none", f"tangram-bench-env:c{i}", "sleep", "1000000"
            )
            figures.setdefault(f"docker run of the commit (fork x1), {mb} MB", []).append(
                time.perf_counter() - t
            )
            _docker("rm", "-f", c, k)
            _docker("rmi", f"tangram-bench-env:c{i}")
    finally:
        subprocess.run(["docker", "rmi", "-f", "tangram-bench-env:latest"], capture_output=True)
    return {k: _ms(v) for k, v in figures.items()}


def main(argv: list[str]) -> int:
    if "--healthz" in argv:  # its own bench, with its own options
        return env_healthz.main([a for a in argv if a != "--healthz"])
    p = argparse.ArgumentParser(
        prog="tangram bench env",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--mb", type=int, default=200, help="MB the busy parent writes")
    p.add_argument("--state-dir", help="default: a fresh folder under /var/tmp")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--healthz",
        action="store_true",
        help="instead: /healthz latency while another client reads 256 MiB through "
        "files/read (`tangram bench env --healthz --help`)",
    )
    ns = p.parse_args(argv)
    state = ns.state_dir or tempfile.mkdtemp(prefix="tangram-bench-env.", dir="/var/tmp")
    docker = (
        bool(shutil.which("docker"))
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )
    try:
        figures = asyncio.run(_bench(state, ns.repeat, ns.group, ns.mb))
        if docker:
            rootfs = ImageStore(f"{state}/images").resolve("bench-tools").rootfs
            figures.update(_bench_docker(rootfs, ns.repeat, ns.mb))
    finally:
        if not ns.state_dir:
            shutil.rmtree(state, ignore_errors=True)
    if ns.json:
        print(json.dumps(figures))
        return 0
    print(f"tangram bench env: median of {ns.repeat}, ms (same run; the machine may be loaded)")
    for k, v in figures.items():
        print(f"  {k:<45}{v:>10.1f}")
    if not docker:
        print("  docker run / docker commit: no Docker engine running here, not measured")
    return 0
