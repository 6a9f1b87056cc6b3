"""An over-limit body gets its 413, never a reset (issue 36, item 7): the server answers, then
reads and drops what the client still sends (bounded: `LINGER_BODY` bytes, `LINGER_S` s)
before it closes, as nginx's lingering close does, so a client that sends the whole body
before it reads (urllib) reads the answer instead of a connection reset."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.runtime.facade import Tangram
from tangram.runtime.http.limits import LINGER_BODY, MAX_BODY
from tangram.runtime.server import BodyLimit, create_app, serve_in_thread

BODY = 20_000_000  # bytes: over the limit, and over what the server reads before it answers
THREADS, ROUNDS = 8, 5
PATH = "/v1/envs/no-such-env/exec"  # the bound holds before the environment is looked up


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    tg = Tangram(cpu=CpuManager(SimCpuBackend()))
    with serve_in_thread(create_app(tg)) as u:
        yield u


def _names_the_limit(text: str) -> None:
    doc = json.loads(text)
    assert doc["field"] == "body", doc
    assert str(MAX_BODY) in doc["error"] and f"at most {MAX_BODY} bytes" in doc["problem"], doc


def _paced(body: bytes, chunk: int = 1 << 20, pause: float = 0.01) -> Iterator[bytes]:
    """The body in chunks with a pause between them, as a loaded client sends it: it is
    still sending when the server answers."""
    for start in range(0, len(body), chunk):
        yield body[start : start + chunk]
        time.sleep(pause)


def _urllib_post(url: str, body: bytes, paced: bool) -> str:
    """'413 <body>' or what the client saw instead (an URLError names a reset)."""
    headers = {"content-type": "application/json", "content-length": str(len(body))}
    data = _paced(body) if paced else body
    req = urllib.request.Request(url + PATH, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return f"{r.status} {r.read()[:200]!r}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode()}"
    except (urllib.error.URLError, OSError) as e:
        return f"error {e!r}"


def _slow_post(url: str, chunk: int = 1 << 20, pause: float = 0.01) -> str:
    """A raw client that sends the whole body in chunks, slowly, then reads the answer: the
    server has long answered (after its first 16 MiB, or at once), and must keep reading."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {BODY}\r\n\r\n"
    ).encode()
    try:
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(head)
            block = b"x" * chunk
            for start in range(0, BODY, chunk):
                s.sendall(block[: BODY - start])
                time.sleep(pause)
            answer = b""
            while data := s.recv(65536):
                answer += data
    except OSError as e:
        return f"error {e!r}"
    head_, _, text = answer.partition(b"\r\n\r\n")
    status = head_.split(b" ", 2)[1].decode() if head_ else "none"
    return f"{status} {text.decode(errors='replace')}"


def _all_413(answers: list[str]) -> None:
    bad = [a[:300] for a in answers if not a.startswith("413 ")]
    assert not bad, f"{len(bad)} of {len(answers)} clients got no 413: {bad[:5]}"
    for a in answers:
        _names_the_limit(a.removeprefix("413 "))


@pytest.mark.parametrize("paced", [False, True], ids=["whole", "paced"])
def test_many_urllib_clients_sending_20_mb_at_once_all_read_their_413(url: str, paced: bool):
    body = b'{"command": "' + b"x" * (BODY - 16) + b'"}'
    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(lambda _: _urllib_post(url, body, paced), range(THREADS * ROUNDS)))
    _all_413(answers)


def test_clients_still_sending_long_after_the_answer_read_their_413(url: str):
    assert BODY < LINGER_BODY  # the whole body is read: the client is never cut
    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(lambda _: _slow_post(url), range(THREADS)))
    _all_413(answers)


@pytest.mark.parametrize(
    ("sent", "linger_body", "linger_s"),
    [(4 << 20, 1 << 30, 0.5), (64 << 20, 8 << 20, 60.0)],
    ids=["time", "bytes"],
)
def test_the_lingering_is_bounded(sent: int, linger_body: int, linger_s: float):
    """A client that declares a huge body and stops sending (or never stops) does not hold
    its connection: the server closes at `linger_s` s (the 413 read first) or at
    `linger_body` bytes (a reset past the bound is its price), long before the client's own
    30 s timeout."""
    tg = Tangram(cpu=CpuManager(SimCpuBackend()))
    app = create_app(tg)
    (limit,) = [m for m in app.user_middleware if m.cls is BodyLimit]
    limit.kwargs.update(drain=2 << 20, linger_body=linger_body, linger_s=linger_s)
    with serve_in_thread(app) as u:
        host, port = u.removeprefix("http://").split(":")
        start, answer = time.monotonic(), b""
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 40}\r\n\r\n".encode()
            )
            try:
                s.sendall(b"x" * sent)
                while data := s.recv(65536):
                    answer += data
            except OSError as e:  # a reset: cut at the byte bound (not our own timeout)
                assert sent > linger_body and not isinstance(e, TimeoutError), repr(e)
        assert time.monotonic() - start < 10  # the server closed, not the client's timeout
    if sent < linger_body:
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
