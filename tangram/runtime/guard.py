"""What keeps `tangram serve` serving under hostile clients: deadlines, connection bounds, the
token before the body, log floods and leaked tokens.

- **Header deadline** (`Limits.header_timeout_s`): a connection has this long from its start
  (plus the keep-alive time, `KEEP_ALIVE_S`, after a response) to deliver a whole request
  head; a trickle of header lines does not extend it. Past it the server closes the
  connection.
- **Whole-body deadline**: the body must be in within `http.limits.BODY_TIMEOUT_S` of the app's
  first read, however it trickles (`BodyLimit`), else 408.
- **Token before body** (`TokenFirst`): on every path that needs the token, a request without
  it is answered 401 (and its connection closed) from its head alone: no body of a client
  without the token is read or buffered. Query tokens are accepted only on SandboxFusion's
  paths (`QUERY_TOKEN_PATHS`), whose clients cannot send headers.
- **Connection bounds** (`Limits.max_connections`, `Limits.per_client`): at a bound, the new
  connection takes the place of the oldest connection without a request head of the client
  address holding the most connections (at the per-client bound: of its own address): first
  those that never delivered a head (slow clients), then idle keep-alive ones (which served a
  request with the token: a request without it closes its connection); a request in progress
  is never cut. Where there is none, the new one is refused (closed at once). A healthy
  client, with a few connections of its own, is therefore served while thousands of slow
  connections from other addresses come and go.
- **Descriptors**: `raise_nofile` lifts the soft open-file limit to the hard one at start, and
  the connection bound and the listen backlog (`backlog`: how many asyncio accepts at once)
  are derived from it, so accepting does not fail for want of descriptors.
- **Logs**: repeated messages (accept errors, invalid requests, closed connections) are
  rate-limited (`RateLimitedLog`), and the token is shown as `***` however the query encodes
  its name or value (`RedactTokens`).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import resource
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from tangram.runtime.guard_logs import FLOOD_LOGGERS as FLOOD_LOGGERS
from tangram.runtime.guard_logs import LOG_EVERY_S as LOG_EVERY_S
from tangram.runtime.guard_logs import RateLimitedLog as RateLimitedLog
from tangram.runtime.guard_logs import RedactTokens as RedactTokens
from tangram.runtime.guard_logs import flood as _flood
from tangram.runtime.guard_logs import quiet_floods as quiet_floods
from tangram.runtime.guard_logs import redact_tokens as redact_tokens
from tangram.runtime.sandboxfusion import UNSERVED

log = logging.getLogger("tangram.runtime.guard")

HEADER_TIMEOUT_S = 10.0  # s from connect (or the last response) to a whole request head
KEEP_ALIVE_S = 5.0  # s an idle keep-alive connection stays open (uvicorn's default)
MAX_HEAD = 16 << 10  # bytes of one request head (h11's bound on an incomplete event)
MAX_CONNECTIONS = 16_384  # at most, whatever the descriptor limit
FD_RESERVE = 256  # descriptors kept for everything but connections (execs, logs, the store)
PER_CLIENT = 4_096  # connections from one client address
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
# SandboxFusion's paths, whose clients (its SDK: `endpoint="http://host:port/?token=T&_="`, which
# puts the path in the query) send no headers: its two runners, the SDK's dispatch `/`, and the
# dataset endpoints it calls, which answer a JSON 404 saying they are not served
QUERY_TOKEN_PATHS = frozenset({"/", "/run_code", "/run_jupyter", *UNSERVED})


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    per_client: int = PER_CLIENT

    @classmethod
    def for_this_process(cls, **overrides: Any) -> Limits:
        """Limits whose connection bound fits the current open-file limit."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        room = (
            max(16, (soft - FD_RESERVE) // 2) if soft != resource.RLIM_INFINITY else MAX_CONNECTIONS
        )
        fields = {
            "max_connections": min(MAX_CONNECTIONS, room),
            "per_client": min(PER_CLIENT, room),
        }
        fields.update(overrides)
        return cls(**fields)


def raise_nofile() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (systemd starts services at 1,024);
    returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


# -- connections -------------------------------------------------------------------------------


class _Connections:
    """The open connections of one server, oldest first, and which of them wait for a head."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[Any, str] = {}  # protocol -> client address
        # connections without a request head, oldest first: never served one, and idle ones
        self.fresh: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.idle: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.per_client: collections.Counter[str] = collections.Counter()
        self.refused = 0  # connections closed at once: no room
        self.evicted = 0  # head-less connections closed to make room
        self.expired = 0  # connections closed at the header deadline
        self.peak = 0  # the most connections open at once

    def admit(self, proto: Any, client: str) -> bool:
        if self.per_client[client] >= self.limits.per_client and not self._evict(
            lambda p: self.open.get(p) == client
        ):
            self.refused += 1
            _flood.note(
                "refused",
                "connection refused: %d from client %s (per-client bound)",
                self.limits.per_client,
                client,
            )
            return False
        if len(self.open) >= self.limits.max_connections and not self._evict_heaviest(client):
            self.refused += 1
            _flood.note(
                "refused",
                "connection refused: %d open (the server's bound), none waiting to evict",
                self.limits.max_connections,
            )
            return False
        self.open[proto] = client
        self.per_client[client] += 1
        self.peak = max(self.peak, len(self.open))
        return True

    def waiting(self, proto: Any) -> bool:
        return proto in self.fresh or proto in self.idle

    def wait(self, proto: Any, served: bool) -> None:
        (self.idle if served else self.fresh)[proto] = None

    def heard(self, proto: Any) -> None:
        self.fresh.pop(proto, None)
        self.idle.pop(proto, None)

    def _evict_heaviest(self, newcomer: str) -> bool:
        """Evict a head-less connection of the address with the most connections (counting
        the newcomer's)."""
        counts = self.per_client.copy()
        counts[newcomer] += 1
        for client, _ in counts.most_common():
            if self._evict(lambda p, c=client: self.open.get(p) == c):
                return True
        return False

    def _evict(self, which) -> bool:
        for old in [*self.fresh, *self.idle]:
            if which(old):
                self.evicted += 1
                _flood.note(
                    "evicted",
                    "closed a connection that sent no request head (at a connection bound)",
                )
                old.drop()
                return True
        return False

    def gone(self, proto: Any) -> None:
        client = self.open.pop(proto, None)
        if client is not None:
            self.per_client[client] -= 1
            if self.per_client[client] <= 0:
                del self.per_client[client]
        self.heard(proto)


class _GuardedH11Protocol(H11Protocol):
    """The guard's h11 protocol; `guarded_protocol` makes one class of it per server, whose
    connections share its `connections_book` under its `guard_limits`."""

    connections_book: _Connections
    guard_limits: Limits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._seen_cycle: Any = None
        self._admitted = self.connections_book.admit(self, (self.client or ("?", 0))[0])
        if not self._admitted:
            transport.abort()
            return
        self._await_head(served=False)

    def _await_head(self, served: bool) -> None:
        self.connections_book.heard(self)
        self.connections_book.wait(self, served)
        self._cancel_head_timer()
        # an idle keep-alive connection may first wait for its next request
        wait = self.guard_limits.header_timeout_s + (self.timeout_keep_alive if served else 0.0)
        self._head_timer = self.loop.call_later(wait, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.connections_book.waiting(self):
            self.connections_book.expired += 1
            _flood.note(
                "expired",
                "closed a connection that sent no whole request head within %g s",
                self.guard_limits.header_timeout_s,
            )
            self.drop()

    def drop(self) -> None:
        self.connections_book.gone(self)
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.abort()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._seen_cycle:
            self._seen_cycle = self.cycle  # a new request's head is in
            self.connections_book.heard(self)
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing() and self in self.connections_book.open:
            self._await_head(served=True)  # the next head has the same deadline
        super().on_response_complete()  # (may start a pipelined request: `heard`)

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_admitted", False):
            self.connections_book.gone(self)
            self._cancel_head_timer()
        super().connection_lost(exc)


def guarded_protocol(limits: Limits) -> type[H11Protocol]:
    """An h11 protocol class (uvicorn's `http=`) that enforces `limits` for one server."""
    book = _Connections(limits)
    return type(
        "GuardedH11Protocol",
        (_GuardedH11Protocol,),
        {"connections_book": book, "guard_limits": limits},
    )


def uvicorn_options(limits: Limits | None = None) -> dict[str, Any]:
    """The options of `uvicorn.Config` that apply the guard."""
    limits = limits or Limits.for_this_process()
    return {
        "http": guarded_protocol(limits),
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEAD,
        "backlog": backlog(limits),
    }


def backlog(limits: Limits) -> int:
    """The listen backlog: asyncio accepts up to this many connections at once, each a
    descriptor until the guard has looked at it, so it stays a fraction of the bound."""
    return max(64, min(2048, limits.max_connections // 4))


# -- the token, before any body ----------------------------------------------------------------


def presented_token(scope: Scope) -> str:
    """The token a request presents: `Authorization: Bearer <token>`, or on SandboxFusion's
    paths only, a `token` query parameter (its name and value decoded as the server would),
    or on SWE-ReX's (`/swerex/...`) only, an `X-API-Key` header (its client's)."""
    swerex = str(scope.get("path", "")).startswith("/swerex/")
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return given
        if swerex and name == b"x-api-key":
            return value.decode("latin-1")
    if scope.get("path") in QUERY_TOKEN_PATHS:
        for pair in scope.get("query_string", b"").decode("latin-1").split("&"):
            key, _, value = pair.partition("=")
            if unquote_plus(key) == "token":
                return unquote_plus(value)
    return ""


def token_ok(scope: Scope, token: str) -> bool:
    return hmac.compare_digest(
        presented_token(scope).encode("utf-8", "surrogateescape"), token.encode()
    )


class TokenFirst:
    """401 from the request head alone on every path but `OPEN_PATHS` when the token is
    missing or wrong; the body is never read and the connection is closed."""

    def __init__(self, app: ASGIApp, token: str | None, unauthorized: Any) -> None:
        self.app, self.token, self.unauthorized = app, token, unauthorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self.token is None
            or scope.get("path") in OPEN_PATHS
            or token_ok(scope, self.token)
        ):
            await self.app(scope, receive, send)
            return
        response = self.unauthorized()
        response.headers["connection"] = "close"

        async def nothing() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)
