"""The http backend against a real loopback server that speaks exactly the SGLang and vLLM
memory endpoints and refuses requests while its weights are released."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from managers.gpu import GB, GpuManager, Residency, Service, ServiceRegistry, create_backend
from managers.gpu.http_backend import Endpoint
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import ChunkPool, Placement
from topology import ChunkTree


class FakeEngine(ThreadingHTTPServer):
    """One inference server: `engine` is "sglang" or "vllm"; records every call."""

    def __init__(self, engine: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.engine = engine
        self.resident = True  # a freshly launched server holds its weights
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeEngine

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _reply(self, code: int, body: object | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        srv = self.server
        sg, vl = srv.engine == "sglang", srv.engine == "vllm"
        if sg and url.path == "/release_memory_occupation":
            srv.resident = False
        elif sg and url.path == "/resume_memory_occupation":
            srv.resident = True
        elif vl and url.path == "/sleep" and parse_qs(url.query).get("level") == ["1"]:
            srv.resident = False
        elif vl and url.path == "/wake_up":
            srv.resident = True
        elif (sg and url.path == "/generate") or (vl and url.path == "/v1/completions"):
            if not srv.resident:
                srv.log.append("refused")
                return self._reply(503, {"error": "weights released"})
            srv.log.append(url.path)
            return self._reply(200, {"text": f"{srv.engine}:{body['prompt']}"})
        else:
            return self._reply(404, {"error": f"no route {self.path}"})
        srv.log.append(url.path)
        self._reply(200, {"success": True} if sg else None)


@pytest.fixture
def servers():
    started = [FakeEngine("sglang"), FakeEngine("vllm")]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in started]
    for t in threads:
        t.start()
    yield started
    for s in started:
        s.shutdown()
        s.server_close()


def test_manager_drives_release_and_resume_over_http(servers) -> None:
    sglang, vllm = servers
    reg = ServiceRegistry(
        {"judge": Service.uniform("judge", 60 * GB), "teacher": Service.uniform("teacher", 60 * GB)}
    )
    res = Residency.uniform({"n": 1}, 80 * GB, reg)
    backend = create_backend(
        "http",
        endpoints={
            ("judge", "n", (0, 1)): Endpoint(sglang.url, "sglang"),
            ("teacher", "n", (0, 1)): Endpoint(vllm.url, "vllm"),
        },
    )
    m = GpuManager(ChunkPool("gpu", {"n": ChunkTree(1, "n")}), res, backend)

    async def go():
        outs = []
        for i, name in enumerate(["judge", "judge", "teacher", "judge"]):
            a = Action(f"x{i}", {"gpu": 1}, duration=1.0, service=name, payload={"prompt": f"p{i}"})
            outs.append(
                await m.run(Assignment(a, {"gpu": 1}, {"gpu": Placement("n", chunk=(0, 1))}))
            )
        await m.close()
        return outs

    outs = asyncio.run(go())
    assert [o.status for o in outs] == ["ok"] * 4, [o.detail for o in outs]
    assert [o.output["text"] for o in outs] == ["sglang:p0", "sglang:p1", "vllm:p2", "sglang:p3"]
    assert [o.detail for o in outs] == ["restored", "resident", "restored", "restored"]
    assert sglang.log == [
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/generate",
        "/generate",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/generate",
    ]
    assert vllm.log == ["/sleep", "/wake_up", "/v1/completions", "/sleep"]
    assert sglang.resident and not vllm.resident


def test_server_errors_become_outcomes(servers) -> None:
    sglang, _ = servers
    reg = ServiceRegistry({"judge": Service.uniform("judge", 10 * GB)})
    backend = create_backend(
        "http",
        endpoints={("judge", "n", (0, 1)): Endpoint(sglang.url, "sglang", request_path="/missing")},
    )
    m = GpuManager(
        ChunkPool("gpu", {"n": ChunkTree(1, "n")}),
        Residency.uniform({"n": 1}, 80 * GB, reg),
        backend,
    )
    a = Action("x", {"gpu": 1}, duration=1.0, service="judge", payload={"prompt": "p"})

    async def go():
        try:
            return await m.run(Assignment(a, {"gpu": 1}, {"gpu": Placement("n", chunk=(0, 1))}))
        finally:
            await m.close()

    out = asyncio.run(go())
    assert out.status == "error" and "HTTP 404" in out.detail


def test_endpoint_validation_names_the_field() -> None:
    with pytest.raises(ValidationError, match="endpoint.engine"):
        Endpoint("http://x", "triton")
    with pytest.raises(ValidationError, match="endpoint.url"):
        Endpoint("x:1", "vllm")
