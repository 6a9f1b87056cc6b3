"""The server's own edges (issue 14, item 7): refusing an open bind, lone surrogates, JSON
syntax errors, stalled bodies, and 413 for clients that send the body without waiting."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.runtime.facade import Tangram
from tangram.runtime.server import MAX_BODY, BodyLimit, create_app, serve_in_thread

JSON = {"content-type": "application/json"}


@pytest.fixture
def url() -> Iterator[str]:
    tg = Tangram(cpu=CpuManager(SimCpuBackend()))
    with serve_in_thread(create_app(tg)) as u:
        yield u


def test_non_loopback_without_a_token_refuses_to_start():
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2 and "--insecure" in out.stderr and "token" in out.stderr


@pytest.mark.parametrize(
    "body",
    [
        '{"trajectory": "\\ud800"}',
        '{"\\udfff": 1, "trajectory": "x"}',
        '{"trajectory": "x", "memory_mb": "\\ud83d"}',
    ],
)
def test_a_lone_surrogate_is_a_4xx_not_a_500(url: str, body: str):
    r = httpx.post(f"{url}/v1/envs", content=body, headers=JSON, timeout=10)
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()) == {"error", "field", "value", "problem"}


def test_a_json_syntax_error_names_the_body_not_an_offset(url: str):
    r = httpx.post(f"{url}/v1/envs", content='{"trajectory": "x",}', headers=JSON, timeout=10)
    assert r.status_code == 422
    doc = r.json()
    assert doc["field"] == "body" and "not valid JSON" in doc["problem"]


def test_a_half_sent_body_times_out_with_408():
    tg = Tangram(cpu=CpuManager(SimCpuBackend()))
    app = create_app(tg)
    (limit,) = [m for m in app.user_middleware if m.cls is BodyLimit]
    limit.kwargs["timeout_s"] = 0.5
    with serve_in_thread(app) as u:
        host, port = u.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(
                b"POST /v1/envs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"traj'
            )
            answer = b""
            while chunk := s.recv(65536):  # the head and the body may come in two segments;
                answer += chunk  # the server closes the connection after it
    text = answer.decode()
    assert text.startswith("HTTP/1.1 408") and '"field":"body"' in text, text


def test_413_reaches_a_client_that_sends_the_body_without_waiting(url: str):
    body = b'{"trajectory": "' + b"x" * (MAX_BODY + 10) + b'"}'
    req = urllib.request.Request(f"{url}/v1/envs", data=body, headers=JSON, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 413
    assert "at most" in info.value.read().decode()
