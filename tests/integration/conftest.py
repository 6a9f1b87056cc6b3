"""Real components for the integration tests: a cgroup-capable root, a Docker engine (started by
`.ci/dockerd.sh`), and a loopback HTTP server that enforces its own rate limit."""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from managers.cpu.backends.cgroup.backend import CgroupBackend


def host_procs_with(marker: str) -> list[int]:
    """PIDs of this machine's processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def procs_with():
    """`host_procs_with` for a test: the processes still alive with a marker."""
    return host_procs_with


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docker: needs a running Docker engine and its test image")
    config.addinivalue_line("markers", "cgroup: needs root and a writable cgroup filesystem")


@pytest.fixture(scope="session")
def cgroup_reason() -> str | None:
    return CgroupBackend.probe()


@pytest.fixture
def need_cgroup(cgroup_reason: str | None) -> None:
    if cgroup_reason is not None:
        pytest.skip(f"cgroup backend unavailable: {cgroup_reason}")


@pytest.fixture(scope="session")
def docker_reason() -> str | None:
    """None when the engine answers and the test image is there; else why not."""
    from managers.cpu.backends.docker import DockerBackend

    return DockerBackend.probe()


@pytest.fixture
def need_docker(docker_reason: str | None) -> None:
    if docker_reason is not None:
        pytest.skip(f"no Docker engine (run `bash .ci/dockerd.sh` as root): {docker_reason}")


# -- a rate-limited upstream ------------------------------------------------------------------


@dataclass
class Upstream:
    """A loopback HTTP API allowing `limit` requests per sliding `period` s; 429 above it."""

    limit: int
    period: float
    latency: float
    url: str = ""
    arrivals: collections.deque = field(default_factory=collections.deque)
    answered: collections.Counter = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self) -> bool:
        now = time.monotonic()
        with self.lock:
            while self.arrivals and self.arrivals[0] <= now - self.period:
                self.arrivals.popleft()
            if len(self.arrivals) >= self.limit:
                self.answered[429] += 1
                return False
            self.arrivals.append(now)
            self.answered[200] += 1
            return True

    def reset(self) -> None:
        with self.lock:
            self.answered.clear()
            self.arrivals.clear()


def _handler(up: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path.startswith("/fail"):
                code, doc = 500, {"error": "upstream failure"}
            elif self.path.startswith("/slow"):
                time.sleep(2.0)
                code, doc = 200, {"slow": True}
            elif not up.admit():
                code, doc = 429, {"error": "rate limited"}
            else:
                time.sleep(up.latency)
                code, doc = 200, {"echo": json.loads(body) if body else None, "path": self.path}
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # a burst of naive concurrent clients must reach the limiter
    daemon_threads = True


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream(
        limit=int(os.environ.get("TANGRAM_TEST_API_LIMIT", "8")), period=0.25, latency=0.005
    )
    server = _Server(("127.0.0.1", 0), _handler(up))
    up.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield up
    finally:
        server.shutdown()
        server.server_close()
