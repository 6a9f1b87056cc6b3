"""`tangram bench env --healthz`: does `/healthz` stay fast while another client reads 256 MiB
through `POST /v1/envs/{id}/files/read` (issue 36: the goal is under 100 ms)?

`tangram serve` runs as its own process on loopback (bwrap backend: root); an environment
holds `--files` files of 64 MiB (sparse: the answer is as large, the disk holds nothing). A
reader, its own process (so its parsing shares no interpreter with the probes), reads them all
in one call `--repeat` times, the bytes counted and dropped; meanwhile `/healthz` is asked
every `--every` ms, a fresh connection each time, as a liveness probe does. The reference, in
the same run just before each read: the same probes with no read going on. Figures: median
and max `/healthz` latency in each, how many probes, and the read's own time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from managers.cpu.backends.bwrap.backend import BwrapBackend

FILE = 64 << 20  # bytes of one file (`files.MAX_FILE`: the most one path may return)
SERVE = (
    sys.executable,
    "-c",
    "import sys; from tangram.runtime.server import main; sys.exit(main(sys.argv[1:]))",
)
# the reader: one files/read call, its answer read in 1 MiB pieces and dropped
READER = """
import http.client, json, sys, time
port, env, paths = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
print("go", flush=True)
t = time.perf_counter()
c.request("POST", f"/v1/envs/{env}/files/read", json.dumps({"paths": paths}),
          {"content-type": "application/json"})
r, n = c.getresponse(), 0
while piece := r.read(1 << 20):
    n += len(piece)
print(r.status, n, time.perf_counter() - t, flush=True)
"""


def unavailable() -> str | None:
    """Why this bench cannot run here (it needs root and the bwrap backend), or None."""
    if os.geteuid() != 0:
        return "needs root (the bwrap backend, like the other env benches): run it as root"
    return BwrapBackend.probe()


def _call(port: int, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = None if body is None else json.dumps(body)
        c.request(method, path, data, {"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


@contextmanager
def _server(state: str) -> Iterator[int]:
    """`tangram serve` on a free loopback port with the bwrap backend; yields the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = os.path.join(state, "tangram.yaml")
    with open(config, "w") as f:
        f.write("cpu: {backend: bwrap}\n")
    proc = subprocess.Popen(
        [*SERVE, "--config", config, "--port", str(port), "--log-level", "warning"],
        env={**os.environ, "TMPDIR": state},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"tangram serve exited: {err[-2000:]}")
            try:
                if _call(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("tangram serve did not start within 120 s")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _probe(port: int) -> float:
    """One `/healthz` on a fresh connection, in seconds."""
    t = time.perf_counter()
    status, _ = _call(port, "GET", "/healthz")
    if status != 200:
        raise RuntimeError(f"/healthz answered {status}")
    return time.perf_counter() - t


def _probes(port: int, every: float, until) -> list[float]:
    """Probe every `every` s (at least one probe) until `until()` is true."""
    out: list[float] = []
    while not out or not until():
        t = time.perf_counter()
        out.append(_probe(port))
        time.sleep(max(0.0, every - (time.perf_counter() - t)))
    return out


def _read_once(port: int, env: str, paths: list[str], every: float) -> tuple[list[float], float]:
    """The probes while one reader reads `paths`, and the read's time (s)."""
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(port), env, json.dumps(paths)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None
    if reader.stdout.readline().strip() != "go":
        raise RuntimeError("the reader did not start")
    during = _probes(port, every, lambda: reader.poll() is not None)
    status, size, seconds = reader.stdout.read().split()
    if reader.wait() != 0 or status != "200" or int(size) < len(paths) * FILE:
        raise RuntimeError(f"the read failed: status {status}, {size} bytes")
    return during, float(seconds)


def _bench(port: int, files: int, repeat: int, every: float) -> dict[str, list[float]]:
    status, body = _call(port, "POST", "/v1/envs", {"trajectory": "bench-healthz"})
    if status != 200:
        raise RuntimeError(f"open_env answered {status}: {body[:500]!r}")
    env = json.loads(body)["env_id"]
    paths = [f"f{i}" for i in range(files)]
    make = "; ".join(f"truncate -s {FILE} /sandbox/{p}" for p in paths)
    status, body = _call(port, "POST", f"/v1/envs/{env}/exec", {"command": make})
    if status != 200 or json.loads(body).get("status") != "ok":
        raise RuntimeError(f"making the files failed: {body[:500]!r}")
    figures: dict[str, list[float]] = {"reference": [], "during": [], "read": []}
    for _ in range(repeat):
        end = time.monotonic() + 2.0  # the reference: 2 s of probes with nothing else going on
        figures["reference"] += _probes(port, every, lambda e=end: time.monotonic() > e)
        during, seconds = _read_once(port, env, paths, every)
        figures["during"] += during
        figures["read"].append(seconds)
    _call(port, "DELETE", f"/v1/envs/{env}")
    return figures


def _report(figures: dict[str, list[float]], files: int, goal_ms: float) -> None:
    ms = {k: [x * 1e3 for x in v] for k, v in figures.items()}
    print(
        f"tangram bench env --healthz: /healthz latency, ms, while another client reads "
        f"{files * FILE >> 20} MiB through files/read ({len(ms['read'])} reads; same run)"
    )
    print(f"  {'':<42}{'median':>10}{'max':>10}{'probes':>8}")
    for key, label in (("reference", "no read going on"), ("during", "during the read")):
        v = ms[key]
        print(f"  {label:<42}{statistics.median(v):>10.1f}{max(v):>10.1f}{len(v):>8}")
    reads = ms["read"]
    print(f"  {'the read itself':<42}{statistics.median(reads):>10.1f}{max(reads):>10.1f}")
    over = sum(x >= goal_ms for x in ms["during"])
    verdict = "met" if not over else f"NOT met ({over} of {len(ms['during'])} probes over it)"
    print(f"  goal: every probe during the read < {goal_ms:g} ms: {verdict}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tangram bench env --healthz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--files", type=int, default=4, help="64 MiB files read in one call")
    p.add_argument("--repeat", type=int, default=3, help="reads (each after its reference)")
    p.add_argument("--every", type=float, default=10.0, help="ms between /healthz probes")
    p.add_argument("--goal-ms", type=float, default=100.0)
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)
    why = unavailable()
    if why:
        print(f"tangram bench env --healthz: skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="tangram-bench-healthz.", dir="/var/tmp") as state:
        with _server(state) as port:
            figures = _bench(port, ns.files, ns.repeat, ns.every / 1e3)
    if ns.json:
        print(json.dumps(figures))
    else:
        _report(figures, ns.files, ns.goal_ms)
    return 0
