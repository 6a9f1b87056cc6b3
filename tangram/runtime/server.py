"""`tangram serve`: the runtime's operations over HTTP (FastAPI), JSON in and out.

Endpoints (field names are the Python API's):

    POST   /v1/envs                    {"trajectory", "memory_mb", "network",
                                        "image", "disk_mb", "snapshot"}          -> {"env_id"}
    .../fork, .../snapshot, .../files  see tangram.runtime.envs_http
    POST   /v1/envs/{env_id}/exec      {"command", "cpu", "elastic", "timeout"}  -> Result
    DELETE /v1/envs/{env_id}                                                     -> {"env_id"}
    POST   /v1/services/{name}/invoke  {"payload", "gpus"}                       -> Result
    POST   /v1/apis/{name}/call        {"payload"}                               -> Result
    GET    /v1/status                  Tangram.status()
    POST   /run_code                   SandboxFusion's request and response (see
                                       tangram.runtime.sandboxfusion and docs/sandboxfusion.md)
    GET    /metrics                    Prometheus text
    GET    /healthz                    {"ok": true} (liveness, no token needed)
    GET    /openapi.json, /docs        the schema (no token needed: it holds no data)

A demand (`cpu`, `gpus`) is an integer (fixed), {"min", "max"} (a range) or a list of allowed
amounts. An action that ran and failed (non-zero exit, timeout) answers 200 with its Result:
its `status` says what happened. Errors answer a JSON body
`{"error": <message>, "field": <name>, "value": <what was given>, "problem": <why>}`:

    401  missing or wrong bearer token (when the server has one; /metrics needs it too),
         answered from the request head: no body is read first. On /run_code the token is
         also accepted as `?token=...` (SandboxFusion clients send no header); logs show it
         as `***` however it is encoded (tangram.runtime.guard).
    404  unknown environment, service or API
    409  a demand no pool can ever meet (`Infeasible`), or one over the capacity of the node
         the environment is bound to (the message names the node and its size)
    408  a request body not all in within BODY_TIMEOUT_S (a trickle does not extend it)
    413  a body over MAX_BODY bytes (read and dropped up to DRAIN_BODY, then answered)
    422  a malformed body or a value the runtime rejects (`ValidationError`)
    429  the scheduler's queue is full (`QueueFull`, Retry-After: 1)
    503  the runtime is shutting down, or a host limit (open files) was reached: the message
         names it
    499  (never seen by the client) it disconnected: its queued action was cancelled

A client that disconnects while its action waits in the queue cancels that action; one that
is already running finishes (its cores are released as usual) and its result is dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tangram.errors import (
    Infeasible,
    LimitReached,
    NotFound,
    QueueFull,
    TangramError,
    ValidationError,
    out_of_files,
)
from tangram.results import Result
from tangram.runtime import envs_http, guard, sandboxfusion
from tangram.runtime.distributed import ray_session
from tangram.runtime.facade import Tangram

log = logging.getLogger("tangram.runtime.server")

MAX_BODY = 1 << 20  # bytes of one request body
BODY_TIMEOUT_S = 30.0  # s for a whole request body, from the app's first read, else 408
DRAIN_BODY = 16 << 20  # bytes of an over-limit body read and dropped before the 413
MAX_COMMAND = 1 << 16  # characters of one command (or of one argv element)
MAX_ARGV = 4096  # elements of an argv command
MAX_TIMEOUT = 24 * 3600.0  # s, an exec's timeout
MAX_UNITS = 1 << 20  # one demand amount (as tangram.resources.MAX_AMOUNT)
MAX_CHOICES = 1024  # amounts in a list demand
MAX_NAME = 256  # characters of a trajectory, env, service or API name

# -- request bodies ----------------------------------------------------------------------------

Units = Annotated[int, Field(ge=1, le=MAX_UNITS)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME,
                            pattern=r"^[^\x00-\x1f\x7f]+$")]  # no control characters (logs)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class UnitRange(_Body):
    """Any amount from `min` to `max` units (inclusive)."""

    min: Units
    max: Units


Demand = Units | UnitRange | Annotated[list[Units], Field(min_length=1, max_length=MAX_CHOICES)]


def demand_arg(d: Demand) -> Any:
    """The Python API's form of a demand: a range is a (lo, hi) tuple."""
    return (d.min, d.max) if isinstance(d, UnitRange) else d


class OpenEnv(_Body):
    trajectory: Name
    memory_mb: Annotated[int, Field(ge=1, le=1 << 24)] = 1024
    network: bool = False
    image: Name | None = None
    disk_mb: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    snapshot: Name | None = None


class Exec(_Body):
    command: (Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)]
              | Annotated[list[Annotated[str, Field(max_length=MAX_COMMAND)]],
                          Field(min_length=1, max_length=MAX_ARGV)])
    cpu: Demand = 1
    elastic: bool = False
    timeout: Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)] = 60.0
    kind: Name | None = None  # the caller's name for the action (keys shared estimates)

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: str | list[str]) -> str | list[str]:
        if any("\x00" in s for s in ([v] if isinstance(v, str) else v)):
            raise ValueError("must not contain NUL characters")
        return v


class Invoke(_Body):
    payload: Any = None
    gpus: Demand = 1


class CallApi(_Body):
    payload: Any = None


_FIELDS = {f for m in (OpenEnv, Exec, Invoke, CallApi, UnitRange) for f in m.model_fields} \
    | sandboxfusion.FIELDS | envs_http.FIELDS


class EnvOut(BaseModel):
    env_id: str


class ErrorOut(BaseModel):
    error: str
    field: str | None = None
    value: Any = None
    problem: str | None = None


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 404, 408, 409, 413, 422, 429, 503)}

# -- errors ------------------------------------------------------------------------------------


def _printable(text: str) -> str:
    """`text` that UTF-8 can carry: a lone surrogate (valid in a JSON string escape, not in
    UTF-8) is written as its escape, `\\ud800`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_value(v: Any, limit: int = 200) -> Any:
    """The offending value as JSON, shortened so an error never echoes a huge payload (and
    as text where JSON cannot hold it: inf, NaN, bytes, lone surrogates)."""
    if isinstance(v, str):
        v = _printable(v)
        return v if len(v) <= limit else v[:limit] + "..."
    try:
        text = json.dumps(v, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError):
        return _printable(repr(v))[:limit]
    return v if len(text) <= limit else text[:limit] + "..."


def error(status: int, message: str, field: str | None = None, value: Any = None,
          problem: str | None = None) -> JSONResponse:
    body = {"error": _printable(message), "field": None if field is None else _printable(field),
            "value": _json_value(value), "problem": None if problem is None else
            _printable(problem)}
    return JSONResponse(jsonable_encoder(body), status_code=status)


def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    """`NotFound` (an environment, service or API that is not there) is 404; the rest 422."""
    assert isinstance(exc, ValidationError)
    return error(404 if isinstance(exc, NotFound) else 422, str(exc), exc.field, exc.value,
                 exc.problem)


def _infeasible(request: Request, exc: Exception) -> JSONResponse:
    field = {"exec": "cpu", "run_code": "cpu", "invoke": "gpus"}.get(
        request.url.path.rsplit("/", 1)[-1])
    return error(409, str(exc), field, problem="no pool can ever meet this demand")


def _queue_full(_: Request, exc: Exception) -> JSONResponse:
    response = error(429, str(exc), "queue", problem="the scheduler's queue is full")
    response.headers["Retry-After"] = "1"
    return response


def _limit_reached(_: Request, exc: Exception) -> JSONResponse:
    response = error(503, str(exc), problem="a limit of the host was reached")
    response.headers["Retry-After"] = "1"
    return response


def _tangram_error(_: Request, exc: Exception) -> JSONResponse:
    closing = "shutting down" in str(exc)
    return error(503 if closing else 400, str(exc))


def _request_error(_: Request, exc: Exception) -> JSONResponse:
    """The first bad field, named as in the body (`cpu`, `cpu.min`); a value that matches no
    form of a union (a demand: int, range or list) lists why each form refused it."""
    assert isinstance(exc, RequestValidationError)
    errs = list(exc.errors()) or [{"loc": (), "msg": "invalid request", "type": "?"}]
    if errs[0].get("type") == "json_invalid":  # its loc is a character offset, not a field
        at = next((p for p in errs[0].get("loc", ()) if isinstance(p, int)), None)
        problem = "not valid JSON" + (f" (at character {at})" if at is not None else "")
        return error(422, f"body: {problem}", "body", None, problem)
    full = tuple(errs[0].get("loc", ()))
    skip = 1 if full and full[0] in ("body", "path", "query", "header") else 0
    named = []
    for part in full[skip:]:  # stop at a union branch's tag ("constrained-int", "UnitRange")
        if not (isinstance(part, int) or part in _FIELDS or errs[0]["type"] == "extra_forbidden"):
            break
        named.append(str(part))
    field = ".".join(named) or "body"
    k = skip + len(named)
    branches = [e for e in errs if tuple(e.get("loc", ()))[:k] == full[:k] and len(e["loc"]) > k]
    if len(branches) > 1:
        problem = "matches no accepted form: " + "; ".join(
            f"as {e['loc'][k]}: {e.get('msg')}" for e in branches[:4])
    else:
        problem = str(errs[0].get("msg", "invalid"))
    return error(422, f"{field}: {problem}", field, errs[0].get("input"), problem)


def _http_error(_: Request, exc: Exception) -> JSONResponse:
    """Starlette's own (no such path, method not allowed) in the same error shape."""
    assert isinstance(exc, StarletteHTTPException)
    response = error(exc.status_code, str(exc.detail), "path" if exc.status_code in (404, 405)
                     else None)
    response.headers.update(exc.headers or {})
    return response


def _internal(request: Request, exc: Exception) -> JSONResponse:
    limit = out_of_files(exc)  # wherever it was met: a 503 naming the limit, not a 500
    if limit is not None:
        log.warning("%s %s: %s", request.method, request.url.path, limit)
        return _limit_reached(request, limit)
    log.exception("internal error", exc_info=exc)
    return error(500, f"internal error: {type(exc).__name__}: {exc}")


# -- transport guards --------------------------------------------------------------------------


class BodyLimit:
    """Reject a body over `limit` bytes with 413 before the app sees it, whether the client
    declared its length or streams it chunked, and a body not all in within `timeout_s` with
    408 (one deadline for the whole body: a trickle does not extend it). Before a 413 the body
    is read and dropped (up to `drain` bytes), so a client that sends it without waiting for
    `Expect: 100-continue` (urllib, requests) reads the answer instead of a broken pipe. The
    app then reads the buffered body and, after it, the connection's own messages (so it still
    hears a disconnect)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY, timeout_s: float = BODY_TIMEOUT_S,
                 drain: int = DRAIN_BODY) -> None:
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = declared is not None and (not declared.isdigit()
                                              or int(declared) > self.limit)
        chunks: list[bytes] = []
        size = 0
        more = True
        deadline = time.monotonic() + self.timeout_s
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                await self._answer(scope, send, 408, f"the request body did not arrive within "
                                   f"{self.timeout_s:g} s", f"send it within {self.timeout_s:g} s")
                return
            if message["type"] != "http.request":  # disconnected before the body was in
                return
            body = message.get("body", b"")
            size += len(body)
            more = message.get("more_body", False)
            if size > self.limit:
                too_large = True
            if too_large:
                if size > self.drain:  # enough read and dropped: answer and close
                    break
                continue
            chunks.append(body)
        if too_large:
            await self._answer(scope, send, 413, f"request body over {self.limit} bytes",
                               f"at most {self.limit} bytes")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _answer(self, scope: Scope, send: Send, status: int, message: str,
                      problem: str) -> None:
        response = error(status, message, "body", problem=problem)
        response.headers["connection"] = "close"

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await response(scope, nothing, send)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[Result]) -> Response:
    """Await `work` while listening for the client going away; if it does, cancel the work (a
    queued action is dropped by the runtime) and answer nobody."""
    action = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({action, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not action.done():
            action.cancel()
        watch.cancel()
    if not action.done() or action.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            await action
        log.info("%s %s: client disconnected; its action was cancelled", request.method,
                 request.url.path)
        return Response(status_code=499)
    return _result_response(action.result())


def _result_response(result: Result) -> JSONResponse:
    doc = jsonable_encoder(result.to_dict())
    try:
        return JSONResponse(doc)
    except ValueError:  # an output JSON cannot hold (inf, NaN): sent as its text
        doc["output"] = repr(result.output)
        return JSONResponse(doc)


# -- the app -----------------------------------------------------------------------------------


def create_app(tg: Tangram, token: str | None = None, *,
               shutdown_deadline: float = 10.0) -> FastAPI:
    """An app serving `tg`. The app's lifespan starts `tg` and shuts it down (stop admitting,
    let running actions finish within `shutdown_deadline` s, close every environment)."""

    stopping: asyncio.Task | None = None

    def stop() -> asyncio.Task:
        """Begin the runtime's graceful shutdown (once); `DrainingServer` calls it as soon as
        the server stops, the lifespan waits for it."""
        nonlocal stopping
        if stopping is None:
            stopping = asyncio.ensure_future(tg.shutdown(deadline=shutdown_deadline))
        return stopping

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await tg.start()
        try:
            yield
        finally:
            await stop()

    async def authorized(request: Request) -> None:
        """(`guard.TokenFirst` refuses a wrong token before the body; this says so in the
        schema and holds where the app runs without that middleware.)"""
        if token is not None and not guard.token_ok(request.scope, token):
            raise _Unauthorized()

    app = FastAPI(title="ARL-Tangram", version="0.1.0", lifespan=lifespan,
                  description="Action-level resource management for agentic RL.")
    app.add_middleware(BodyLimit)
    app.add_middleware(guard.TokenFirst, token=token, unauthorized=_unauthorized)  # outermost
    app.state.tangram = tg
    app.state.stop = stop
    app.add_exception_handler(_Unauthorized, lambda r, e: _unauthorized())
    app.add_exception_handler(ValidationError, _validation_error)
    app.add_exception_handler(Infeasible, _infeasible)
    app.add_exception_handler(QueueFull, _queue_full)
    app.add_exception_handler(LimitReached, _limit_reached)
    app.add_exception_handler(TangramError, _tangram_error)
    app.add_exception_handler(RequestValidationError, _request_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal)
    guarded = [Depends(authorized)]
    app.include_router(sandboxfusion.router, dependencies=guarded, responses=ERRORS)
    app.include_router(envs_http.router, dependencies=guarded, responses=ERRORS)
    for name in ("uvicorn.access", "uvicorn.error", log.name):
        guard.redact_tokens(logging.getLogger(name), token)

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/v1/envs", dependencies=guarded, responses=ERRORS)
    async def open_env(body: OpenEnv) -> EnvOut:
        return EnvOut(env_id=await tg.open_env(body.trajectory, body.memory_mb,
                                               network=body.network, image=body.image,
                                               disk_mb=body.disk_mb, snapshot=body.snapshot))

    @app.delete("/v1/envs/{env_id}", dependencies=guarded, responses=ERRORS)
    async def close_env(env_id: str) -> EnvOut:
        await tg.close_env(env_id)
        return EnvOut(env_id=env_id)

    @app.post("/v1/envs/{env_id}/exec", dependencies=guarded, response_model=None,
              responses={200: {"model": Result}, **ERRORS})
    async def exec_(env_id: str, body: Exec, request: Request) -> Response:
        command = body.command if isinstance(body.command, str) else list(body.command)
        return await _unless_disconnected(request, tg.exec(
            env_id, command, cpu=demand_arg(body.cpu), elastic=body.elastic,
            timeout=body.timeout, kind=body.kind))

    @app.post("/v1/services/{name}/invoke", dependencies=guarded, response_model=None,
              responses={200: {"model": Result}, **ERRORS})
    async def invoke(name: str, body: Invoke, request: Request) -> Response:
        return await _unless_disconnected(request, tg.invoke(name, body.payload,
                                                             gpus=demand_arg(body.gpus)))

    @app.post("/v1/apis/{name}/call", dependencies=guarded, response_model=None,
              responses={200: {"model": Result}, **ERRORS})
    async def call_api(name: str, body: CallApi, request: Request) -> Response:
        return await _unless_disconnected(request, tg.call_api(name, body.payload))

    @app.get("/v1/status", dependencies=guarded, responses=ERRORS)
    async def status() -> dict[str, Any]:
        return tg.status()

    @app.get("/metrics", dependencies=guarded, response_class=Response,
             responses={200: {"content": {"text/plain": {}}}, 401: {"model": ErrorOut}})
    async def metrics() -> Response:
        return Response(tg.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


class _Unauthorized(Exception):
    pass


RedactTokens = guard.RedactTokens  # where earlier code imported it from


def _unauthorized() -> JSONResponse:
    response = error(401, "missing or wrong bearer token", "authorization",
                     problem='send "Authorization: Bearer <token>" or ?token=<token>')
    response.headers["www-authenticate"] = "Bearer"
    return response


# -- tangram serve -----------------------------------------------------------------------------


class DrainingServer(uvicorn.Server):
    """uvicorn waits for open requests before the app's lifespan shutdown, but those requests
    wait on the runtime: so the runtime starts its graceful shutdown (no new actions, queued
    ones cancelled, running ones get the deadline) the moment the server stops, and every open
    request is answered with its action's result."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stop = getattr(getattr(self.config.app, "state", None), "stop", None)
        if stop is not None:
            stop()
        await super().shutdown(sockets)


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                    startup_timeout: float = 30.0, limits: guard.Limits | None = None
                    ) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread (its own event loop) until the block
    ends, then shut it down gracefully (the app's lifespan shuts the runtime down). Yields the
    base URL; port 0 picks a free one; `limits`: the guard's (default: from this process's
    open-file limit). For tests and benchmarks."""
    options = guard.uvicorn_options(limits)
    app.state.connections = options["http"].connections_book  # for tests: what the guard saw
    server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           lifespan="on", **options))
    thread = threading.Thread(target=server.run, name="tangram-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise TangramError(f"the server did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=startup_timeout)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tangram serve", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML cluster config (default: Tangram.local())")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--token", default=os.environ.get("TANGRAM_TOKEN"),
                        help="require 'Authorization: Bearer TOKEN' or ?token=TOKEN "
                             "(default: $TANGRAM_TOKEN)")
    parser.add_argument("--shutdown-deadline", type=float, default=10.0, metavar="S",
                        help="on stop, running actions get this long to finish (default 10)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback --host without a token (anyone who reaches "
                             "it can run commands)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="serve over a Ray cluster: auto, ray://head:10001, or local:N[xC] "
                             "to start N local nodes of C cores (sim backend)")
    parser.add_argument("--shards", type=int, metavar="N",
                        help="split the scheduler into N node shards, each a process (a Ray "
                             "actor with --ray); with --config, set `shards:` there")
    ns = parser.parse_args(argv)
    if ns.shards is not None and (ns.shards < 0 or ns.config):
        parser.error("--shards must be >= 0 (0: one scheduler process)" if ns.shards < 0 else
                     "--shards and --config are exclusive: set `shards: N` in the config file")
    shards = {"shards": ns.shards} if ns.shards else {}
    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    guard.raise_nofile()  # before anything opens: the connection bound is derived from it
    guard.quiet_floods()
    if not _is_loopback(ns.host) and not ns.token and not ns.insecure:
        print(f"tangram serve: refusing to serve on {ns.host} without a token: set --token (or "
              "TANGRAM_TOKEN), or pass --insecure to accept that anyone who reaches it can run "
              "commands", file=sys.stderr)
        return 2
    if ns.ray:
        if ns.config:
            parser.error("--ray and --config are exclusive")
        with ray_session(ns.ray) as (address, opts):
            return _serve(ns, Tangram.ray(address, **opts, **shards))
    return _serve(ns, Tangram.from_config(ns.config) if ns.config else Tangram.local(**shards))


def _serve(ns: argparse.Namespace, tg: Tangram) -> int:
    if not _is_loopback(ns.host) and not ns.token:
        log.warning("INSECURE: serving on %s without a token: anyone who reaches it can run "
                    "commands", ns.host)
    app = create_app(tg, ns.token or None, shutdown_deadline=ns.shutdown_deadline)
    limits = guard.Limits.for_this_process()
    print(f"tangram serve: http://{ns.host}:{ns.port} (schema at /docs; at most "
          f"{limits.max_connections} connections, {limits.per_client} per client)",
          file=sys.stderr)
    DrainingServer(uvicorn.Config(app, host=ns.host, port=ns.port,
                                  log_level=ns.log_level.lower(),
                                  timeout_graceful_shutdown=ns.shutdown_deadline + 5,
                                  **guard.uvicorn_options(limits))).run()
    return 0
