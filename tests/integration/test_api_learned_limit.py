"""Flow control learns an upstream's limit from its answers (429 and Retry-After), against a
real loopback server whose concurrency limit changes mid-run: Tangram starts with a wrong
(four times too high) limit, draws some 429s, then none while the limit holds; when the limit
drops it draws a few more and settles again; when it rises the window grows past the old one."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from managers.api import ApiConfig, ApiManager, ApiRequest
from managers.basic import Limits
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.pools import Placement


class LimitedServer:
    """Answers 429 (Retry-After 0.05 s) to a request arriving while `limit` are in flight."""

    def __init__(self, limit: int, latency: float = 0.05) -> None:
        self.limit = limit
        self.latency = latency
        self.in_flight = 0
        self.peak = 0
        self.answers: list[int] = []  # status codes in the order answered
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self):
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with up.lock:
                    ok = up.in_flight < up.limit
                    if ok:
                        up.in_flight += 1
                        up.peak = max(up.peak, up.in_flight)
                if ok:
                    time.sleep(up.latency)
                    with up.lock:
                        up.in_flight -= 1
                code = 200 if ok else 429
                with up.lock:
                    up.answers.append(code)
                body = json.dumps({"ok": ok}).encode()
                self.send_response(code)
                if not ok:
                    self.send_header("Retry-After", "0.05")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def phase(self, limit: int) -> int:
        """Set a new limit; returns where this phase's answers start."""
        with self.lock:
            self.limit, self.peak = limit, 0
            return len(self.answers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    s = LimitedServer(limit=4)
    yield s
    s.close()


def _call(api: ApiConfig, i: int) -> Assignment:
    a = Action(f"c{i}-{uuid.uuid4().hex[:4]}", {api.resource: 1}, payload=ApiRequest("/q"))
    return Assignment(a, {api.resource: 1}, {api.resource: Placement("basic")})


def test_a_wrong_limit_is_learned_and_followed_when_it_changes(server):
    api = ApiConfig("s", server.url, Limits(concurrency=16))  # four times the real limit
    m = ApiManager([api])
    phases = []

    async def burst(n: int):
        return await asyncio.gather(*(m.run(_call(api, i)) for i in range(n)))

    async def go():
        try:
            for limit, n in ((4, 120), (2, 120), (6, 400)):
                start = server.phase(limit)
                outcomes = await burst(n)
                assert all(o.status == "ok" for o in outcomes), [
                    o.detail for o in outcomes if o.status != "ok"
                ][:3]
                phases.append((limit, server.answers[start:], server.peak, m.window("s").window))
        finally:
            await m.close()

    asyncio.run(go())
    (l1, a1, _, w1), (l2, a2, _, w2), (l3, a3, peak3, _) = phases
    refused = lambda xs: sum(c == 429 for c in xs)
    first, late = lambda xs: xs[: len(xs) // 2], lambda xs: xs[len(xs) // 2 :]
    # it started wrong and the server said so; then the 429s thin out to a probe's (1-3)
    assert refused(first(a1)) > refused(late(a1)) and refused(late(a1)) <= 3
    assert w1 <= 2 * l1  # the window sits near the limit (the server frees a slot before
    assert w2 <= 2 * l2  # our client hears the answer, so a little above it can hold)
    assert refused(a2) > 0  # the limit dropped under the learned window
    # the drop is learned from its first 429s; past them at most a probe's (a loaded machine
    # may put the one or two refusals of a small drop in the second half: bounded all the same)
    assert refused(late(a2)) <= 3
    assert peak3 > l2  # the limit rose: probing found more room
    assert sum(c == 200 for c in a1 + a2 + a3) == 120 + 120 + 400


def test_without_learning_the_wrong_limit_keeps_drawing_429(server):
    api = ApiConfig("s", server.url, Limits(concurrency=16), learn=False, retries=0)
    m = ApiManager([api])

    async def go():
        try:
            return await asyncio.gather(*(m.run(_call(api, i)) for i in range(160)))
        finally:
            await m.close()

    outcomes = asyncio.run(go())
    assert sum(o.status == "error" for o in outcomes) > 0  # 429s became errors
    assert sum(c == 429 for c in server.answers[80:]) > 1
