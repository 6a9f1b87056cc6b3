"""The body guard: one deadline and one size bound for a whole request body, enforced before
the app reads it (`tangram.runtime.guard` has the head's: token first, header deadline,
connection bounds)."""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tangram.runtime.http.errors import error
from tangram.runtime.http.limits import (
    BODY_TIMEOUT_S,
    DRAIN_BODY,
    LINGER_BODY,
    LINGER_S,
    MAX_BODY,
)

FILE_BODY = 64 << 20  # bytes of a SWE-ReX upload or file write (`files.MAX_FILE`)
FILE_PATHS = ("/upload", "/write_file")


class BodyLimit:
    """Reject a body over `limit` bytes with 413 before the app sees it, whether the client
    declared its length or streams it chunked, and a body not all in within `timeout_s` with
    408 (one deadline for the whole body: a trickle does not extend it). Before a 413 the body
    is read and dropped (up to `drain` bytes), and after it, before the connection closes, the
    rest (a lingering close, as nginx's: until the body ends, `linger_body` bytes of it in all
    or `linger_s` s), so a client that sends it all without waiting for
    `Expect: 100-continue` (urllib, requests) reads the answer instead of a connection reset.
    The app then reads the buffered body and, after it, the connection's own messages (so it
    still hears a disconnect)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int = MAX_BODY,
        timeout_s: float = BODY_TIMEOUT_S,
        drain: int = DRAIN_BODY,
        linger_body: int = LINGER_BODY,
        linger_s: float = LINGER_S,
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.drain = drain
        self.linger_body = linger_body
        self.linger_s = linger_s

    def limit_of(self, scope: Scope) -> int:
        """The body bound of a request: `limit`, or `FILE_BODY` for SWE-ReX's file uploads
        and writes (its client sends a file in one body)."""
        path = str(scope.get("path", ""))
        if path.startswith("/swerex/") and path.endswith(FILE_PATHS):
            return max(self.limit, FILE_BODY)
        return self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = declared is not None and (not declared.isdigit() or int(declared) > limit)
        chunks: list[bytes] = []
        size = 0
        more = True
        deadline = time.monotonic() + self.timeout_s
        while more:
            try:
                # a deadline, not `wait_for`: no task per message (a body is one message)
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                await self._answer(
                    scope,
                    send,
                    408,
                    f"the request body did not arrive within {self.timeout_s:g} s",
                    f"send it within {self.timeout_s:g} s",
                )
                return
            if message["type"] != "http.request":  # disconnected before the body was in
                return
            body = message.get("body", b"")
            size += len(body)
            more = message.get("more_body", False)
            if size > limit:
                too_large = True
            if too_large:
                if size > self.drain:  # enough read and dropped: answer and close
                    break
                continue
            chunks.append(body)
        if too_large:
            await self._refuse(scope, receive, send, size, more)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _answer(
        self, scope: Scope, send: Send, status: int, message: str, problem: str
    ) -> None:
        response = error(status, message, "body", problem=problem)
        response.headers["connection"] = "close"

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, size: int, more: bool
    ) -> None:
        """413, sent whole (its head and body, `Connection: close`) while the response is held
        open: what the client still sends is read and dropped (`_linger`) before the last,
        empty message lets the server close, so (within the linger's bounds) the close finds
        nothing unread and the kernel sends the client no reset ahead of the answer."""
        limit = self.limit_of(scope)
        response = error(
            413,
            f"request body over {limit} bytes",
            "body",
            problem=f"at most {limit} bytes",
        )
        response.headers["connection"] = "close"

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        async def held(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "more_body": True}
            await send(message)

        await response(scope, nothing, held)
        if more:
            await self._linger(receive, size)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _linger(self, receive: Receive, size: int) -> None:
        """Read and drop the rest of a refused body: until it ends or the client leaves, or
        `linger_body` bytes of it are in (`size` already), or `linger_s` s have passed."""
        try:
            async with asyncio.timeout(self.linger_s):
                while size < self.linger_body:
                    message = await receive()
                    if message["type"] != "http.request":
                        return
                    size += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return
        except TimeoutError:
            return
