"""`tangram serve`: the runtime's operations over HTTP (FastAPI), JSON in and out.

Endpoints (field names are the Python API's):

    POST   /v1/envs                    {"trajectory", "memory_mb", "network",
                                        "image", "disk_mb", "snapshot"}          -> {"env_id"}
    .../fork, .../snapshot, .../files  see tangram.runtime.http.env_routes
    .../sessions                       see tangram.runtime.http.session_routes
    /swerex/{env_id}/...               SWE-ReX's remote runtime: tangram.runtime.http.swerex
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

This module assembles the app from `tangram.runtime.http` (limits, schemas, errors, the body
guard, routes) and `tangram.runtime.guard` (the head's defences), and serves it; the names
earlier code imported from here are re-exported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import Depends, FastAPI, Request

from tangram.errors import TangramError
from tangram.runtime import guard, sandboxfusion
from tangram.runtime.facade import Tangram
from tangram.runtime.http import env_routes, routes, session_routes, swerex
from tangram.runtime.http.body import BodyLimit
from tangram.runtime.http.errors import Unauthorized, error, install_handlers, unauthorized
from tangram.runtime.http.limits import (
    BODY_TIMEOUT_S,
    DRAIN_BODY,
    MAX_ARGV,
    MAX_BODY,
    MAX_CHOICES,
    MAX_COMMAND,
    MAX_NAME,
    MAX_TIMEOUT,
    MAX_UNITS,
)
from tangram.runtime.http.schemas import (
    ERRORS,
    CallApi,
    Demand,
    EnvOut,
    ErrorOut,
    Exec,
    Invoke,
    OpenEnv,
    UnitRange,
    demand_arg,
)
from tangram.runtime.ray import ray_session

log = logging.getLogger("tangram.runtime.server")
RedactTokens = guard.RedactTokens  # where earlier code imported it from
__all__ = [  # what earlier code imported from here, now at home in tangram.runtime.http
    "BODY_TIMEOUT_S",
    "DRAIN_BODY",
    "ERRORS",
    "MAX_ARGV",
    "MAX_BODY",
    "MAX_CHOICES",
    "MAX_COMMAND",
    "MAX_NAME",
    "MAX_TIMEOUT",
    "MAX_UNITS",
    "BodyLimit",
    "CallApi",
    "Demand",
    "DrainingServer",
    "EnvOut",
    "ErrorOut",
    "Exec",
    "Invoke",
    "OpenEnv",
    "RedactTokens",
    "UnitRange",
    "create_app",
    "demand_arg",
    "error",
    "main",
    "serve_in_thread",
]


# -- the app -----------------------------------------------------------------------------------


def _lifespan(tg: Tangram, shutdown_deadline: float):
    """The app's lifespan (start `tg`; at the end, wait for its graceful shutdown) and `stop`,
    which begins that shutdown once (`DrainingServer` calls it as soon as the server stops)."""
    stopping: asyncio.Task | None = None

    def stop() -> asyncio.Task:
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

    return lifespan, stop


def create_app(
    tg: Tangram, token: str | None = None, *, shutdown_deadline: float = 10.0
) -> FastAPI:
    """An app serving `tg`. The app's lifespan starts `tg` and shuts it down (stop admitting,
    let running actions finish within `shutdown_deadline` s, close every environment)."""
    lifespan, stop = _lifespan(tg, shutdown_deadline)

    async def authorized(request: Request) -> None:
        """(`guard.TokenFirst` refuses a wrong token before the body; this says so in the
        schema and holds where the app runs without that middleware.)"""
        if token is not None and not guard.token_ok(request.scope, token):
            raise Unauthorized()

    app = FastAPI(
        title="ARL-Tangram",
        version="0.1.0",
        lifespan=lifespan,
        description="Action-level resource management for agentic RL.",
    )
    app.add_middleware(BodyLimit)
    app.add_middleware(guard.TokenFirst, token=token, unauthorized=unauthorized)  # outermost
    app.state.tangram = tg
    app.state.stop = stop
    install_handlers(app)
    guarded = [Depends(authorized)]
    for router in (sandboxfusion.router, env_routes.router, session_routes.router, swerex.router):
        app.include_router(router, dependencies=guarded, responses=ERRORS)
    app.include_router(routes.health)
    app.include_router(routes.router, dependencies=guarded, responses=ERRORS)
    app.include_router(routes.scrape, dependencies=guarded)
    for name in ("uvicorn.access", "uvicorn.error", log.name):
        guard.redact_tokens(logging.getLogger(name), token)
    return app


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
def serve_in_thread(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 30.0,
    limits: guard.Limits | None = None,
) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread (its own event loop) until the block
    ends, then shut it down gracefully (the app's lifespan shuts the runtime down). Yields the
    base URL; port 0 picks a free one; `limits`: the guard's (default: from this process's
    open-file limit). For tests and benchmarks."""
    options = guard.uvicorn_options(limits)
    app.state.connections = options["http"].connections_book  # for tests: what the guard saw
    server = DrainingServer(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **options)
    )
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


def _parser() -> argparse.ArgumentParser:
    """`tangram serve`'s command line."""
    parser = argparse.ArgumentParser(prog="tangram serve", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML cluster config (default: Tangram.local())")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument(
        "--token",
        default=os.environ.get("TANGRAM_TOKEN"),
        help="require 'Authorization: Bearer TOKEN' or ?token=TOKEN (default: $TANGRAM_TOKEN)",
    )
    parser.add_argument(
        "--shutdown-deadline",
        type=float,
        default=10.0,
        metavar="S",
        help="on stop, running actions get this long to finish (default 10)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without a token (anyone who reaches it can run commands)",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="serve over a Ray cluster: auto, ray://head:10001, or local:N[xC] "
        "to start N local nodes of C cores (sim backend)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="split the scheduler into N node shards, each a process (a Ray "
        "actor with --ray); with --config, set `shards:` there",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.shards is not None and (ns.shards < 0 or ns.config):
        parser.error(
            "--shards must be >= 0 (0: one scheduler process)"
            if ns.shards < 0
            else "--shards and --config are exclusive: set `shards: N` in the config file"
        )
    shards = {"shards": ns.shards} if ns.shards else {}
    logging.basicConfig(level=ns.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    guard.raise_nofile()  # before anything opens: the connection bound is derived from it
    guard.quiet_floods()
    if not _is_loopback(ns.host) and not ns.token and not ns.insecure:
        print(
            f"tangram serve: refusing to serve on {ns.host} without a token: set --token (or "
            "TANGRAM_TOKEN), or pass --insecure to accept that anyone who reaches it can run "
            "commands",
            file=sys.stderr,
        )
        return 2
    if ns.ray:
        if ns.config:
            parser.error("--ray and --config are exclusive")
        with ray_session(ns.ray) as (address, opts):
            return _serve(ns, Tangram.ray(address, **opts, **shards))
    return _serve(ns, Tangram.from_config(ns.config) if ns.config else Tangram.local(**shards))


def _serve(ns: argparse.Namespace, tg: Tangram) -> int:
    if not _is_loopback(ns.host) and not ns.token:
        log.warning(
            "INSECURE: serving on %s without a token: anyone who reaches it can run commands",
            ns.host,
        )
    app = create_app(tg, ns.token or None, shutdown_deadline=ns.shutdown_deadline)
    limits = guard.Limits.for_this_process()
    print(
        f"tangram serve: http://{ns.host}:{ns.port} (schema at /docs; at most "
        f"{limits.max_connections} connections, {limits.per_client} per client)",
        file=sys.stderr,
    )
    DrainingServer(
        uvicorn.Config(
            app,
            host=ns.host,
            port=ns.port,
            log_level=ns.log_level.lower(),
            timeout_graceful_shutdown=ns.shutdown_deadline + 5,
            **guard.uvicorn_options(limits),
        )
    ).run()
    return 0
