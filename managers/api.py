"""The API manager (paper 5.1): rate-limited external APIs behind the basic manager's gates.

An API is configured by name (`ApiConfig`: base URL, method, headers, limits, timeout,
retries); an action demanding `api:<name>` performs one HTTP request built from its `ApiRequest`
payload. Flow control (concurrency slots, sliding-window quota held until a period after each
response) keeps the upstream under its configured limit; with `learn` (the default) it also
finds the upstream's real limit from its answers (`managers.flow`: a window cut in half on a
429, paused for its `Retry-After`, grown one call per window of answers, capped where the last
429 put the limit), so a wrong or changing limit costs a few 429s at first, then none. An answer
of 429 while learning is retried (at most `MAX_REFUSED` times a call) without using `retries`.
Errors and timeouts come back as outcomes saying what happened; retries back off and each
attempt counts against the quota.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx

from managers.basic import BasicManager, Gate, Limits
from managers.flow import AimdWindow, WindowGate
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.results import Result, Status

RETRYABLE = frozenset({429, 502, 503, 504})
MAX_REFUSED = 16  # answers of 429 one call may draw while the window learns


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """One upstream API. Its resource name is `api:<name>`."""

    name: str
    base_url: str
    limits: Limits
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    retries: int = 0
    backoff_s: float = 0.1
    learn: bool = True  # learn the upstream's limit from its 429s; `limits` is the start

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or ":" in self.name:
            raise ValidationError("api.name", self.name, "must be a non-empty name without ':'")
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise ValidationError(
                f"api[{self.name}].base_url", self.base_url, "must be an http:// or https:// URL"
            )
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValidationError(f"api[{self.name}].timeout_s", t, "must be positive seconds")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValidationError(
                f"api[{self.name}].retries", self.retries, "must be a non-negative integer"
            )
        if not isinstance(self.learn, bool):
            raise ValidationError(f"api[{self.name}].learn", self.learn, "must be true or false")
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    @property
    def resource(self) -> str:
        return f"api:{self.name}"


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """The payload of an API action: path under the base URL, JSON body, query parameters."""

    path: str = ""
    json: Any = None
    params: Mapping[str, str] | None = None
    method: str | None = None


def api_action(name: str, payload: Any, now: float, kind: str | None = None) -> Action:
    """The action of one call of API `name` (one unit of `api:<name>`), submitted at `now`;
    a payload that is not an `ApiRequest` is its JSON body. `kind`: the trusted caller's
    name for what it is (the estimates it shares), else `api:<name>`."""
    if not isinstance(payload, ApiRequest):
        payload = ApiRequest(json=payload)
    return Action(
        f"a-{uuid.uuid4().hex[:12]}",
        {f"api:{name}": 1},
        kind=kind if kind is not None else f"api:{name}",
        payload=payload,
        submit_time=now,
    )


@dataclass(frozen=True, slots=True)
class ApiResponse:
    status_code: int
    body: Any
    attempts: int


class ApiManager(BasicManager):
    """One gate and one pool (`api:<name>`) per configured API, one shared HTTP client."""

    name = "api"

    def __init__(self, apis: Sequence[ApiConfig], client: httpx.AsyncClient | None = None) -> None:
        self.apis = {a.resource: a for a in apis}
        if len(self.apis) != len(apis):
            raise ValidationError("apis", [a.name for a in apis], "names must be distinct")
        super().__init__({r: a.limits for r, a in self.apis.items()})
        self.windows = {
            r: WindowGate(AimdWindow(a.limits.slots, most=a.limits.slots))
            for r, a in self.apis.items()
            if a.learn
        }
        self._client = client
        self._own_client = client is None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)
            )
        return self._client

    async def perform(self, assignment: Assignment, gates: list[Gate]) -> Result:
        req = assignment.action.payload
        if req is None:
            req = ApiRequest()
        if not isinstance(req, ApiRequest):
            return Result(
                Status.FAILED,
                detail=f"action {assignment.action_id}: payload must "
                f"be an ApiRequest, got {type(req).__name__}",
            )
        api = self.apis[next(r for r in assignment.action.demands if r in self.apis)]
        gate = self.gates[api.resource]
        url = api.base_url.rstrip("/") + "/" + req.path.lstrip("/") if req.path else api.base_url
        method = req.method or api.method
        learning = self.windows.get(api.resource)
        last = ""
        attempt = refused = 0
        while attempt < api.retries + 1:
            attempt += 1
            if attempt > 1 and not (learning and refused):
                await asyncio.sleep(api.backoff_s * 2 ** (attempt - 2))
            try:
                async with _attempt(learning) as (sent_at, before), gate.use():
                    resp = await self.client.request(
                        method,
                        url,
                        json=req.json,
                        params=req.params,
                        headers=dict(api.headers),
                        timeout=api.timeout_s,
                    )
                if learning is not None:
                    await self._learn(learning, resp, sent_at, before)
                    if resp.status_code == 429 and refused < MAX_REFUSED:
                        refused += 1
                        attempt -= 1  # the window waits Retry-After; not one of `retries`
                        continue
            except httpx.TimeoutException:
                last = f"{method} {url}: no answer within {api.timeout_s:g} s"
                status = Status.TIMEOUT
                continue
            except httpx.HTTPError as exc:
                last = f"{method} {url}: {type(exc).__name__}: {exc}"
                status = Status.FAILED
                continue
            body = _body(resp)
            out = ApiResponse(resp.status_code, body, attempt + refused)
            if resp.is_success:
                return Result(Status.OK, output=out, detail=f"HTTP {resp.status_code}")
            last = f"{method} {url}: HTTP {resp.status_code}"
            status = Status.ERROR
            if resp.status_code not in RETRYABLE or attempt == api.retries + 1:
                return Result(
                    Status.ERROR, output=out, detail=last + f" after {attempt} attempt(s)"
                )
            await asyncio.sleep(_retry_after(resp))
        return Result(status, detail=f"{last} after {api.retries + 1} attempt(s)")

    async def _learn(
        self, learning: WindowGate, resp: httpx.Response, sent_at: float, before: int
    ) -> None:
        now = learning.clock()
        if resp.status_code == 429:
            learning.window.refused_answer(sent_at, before, _retry_after(resp), now)
        else:
            learning.window.answered(now)
        await learning.tell()

    def window(self, name: str) -> AimdWindow | None:
        """The learned window of API `name` (None when it does not learn)."""
        w = self.windows.get(f"api:{name}")
        return None if w is None else w.window

    def throttled(self, name: str) -> int:
        """Calls to API `name` that flow control held back to keep it under its quota."""
        gate = self.gates.get(f"api:{name}")
        return gate.throttled if gate is not None else 0

    async def close(self) -> None:
        if self._client is not None and self._own_client:
            await self._client.aclose()
            self._client = None


@asynccontextmanager
async def _attempt(learning: WindowGate | None) -> AsyncIterator[tuple[float, int]]:
    if learning is None:
        yield 0.0, 0
        return
    async with learning.attempt() as held:
        yield held


def _retry_after(resp: httpx.Response, most: float = 60.0) -> float:
    """Seconds the upstream asked us to wait (Retry-After in seconds), 0 when it did not."""
    try:
        return min(max(float(resp.headers.get("Retry-After", 0)), 0.0), most)
    except ValueError:
        return 0.0


def _body(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text
