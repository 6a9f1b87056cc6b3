"""The native endpoints (`/v1/...`, `/metrics`, `/healthz`): each turns its body into one call
of the `Tangram` the app serves (`app.state.tangram`) and its answer into JSON. A client that
disconnects while its action waits cancels that action."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response

from tangram.results import Result
from tangram.runtime.http.owned import not_pooled
from tangram.runtime.http.schemas import (
    CallApi,
    EnvOut,
    ErrorOut,
    Exec,
    Invoke,
    OpenEnv,
    demand_arg,
)

log = logging.getLogger("tangram.runtime.server")

router = APIRouter(dependencies=[Depends(not_pooled)])  # mounted behind the token
health = APIRouter()  # mounted open: liveness needs no token
scrape = APIRouter()  # mounted behind the token, its only error a 401
RESULT = {200: {"model": Result}}


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[Result]) -> Response:
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
        log.info(
            "%s %s: client disconnected; its action was cancelled", request.method, request.url.path
        )
        return Response(status_code=499)
    return result_response(action.result())


def result_response(result: Result) -> JSONResponse:
    """A result as the API's JSON (`Result.to_dict`: the edge where placements become data)."""
    doc = jsonable_encoder(result.to_dict())
    try:
        return JSONResponse(doc)
    except ValueError:  # an output JSON cannot hold (inf, NaN): sent as its text
        doc["output"] = repr(result.output)
        return JSONResponse(doc)


@health.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.post("/v1/envs")
async def open_env(body: OpenEnv, request: Request) -> EnvOut:
    tg = request.app.state.tangram
    return EnvOut(
        env_id=await tg.open_env(
            body.trajectory,
            body.memory_mb,
            network=body.network,
            image=body.image,
            disk_mb=body.disk_mb,
            snapshot=body.snapshot,
        )
    )


@router.delete("/v1/envs/{env_id}")
async def close_env(env_id: str, request: Request) -> EnvOut:
    await request.app.state.tangram.close_env(env_id)
    return EnvOut(env_id=env_id)


@router.post("/v1/envs/{env_id}/exec", response_model=None, responses=RESULT)
async def exec_(env_id: str, body: Exec, request: Request) -> Response:
    command = body.command if isinstance(body.command, str) else list(body.command)
    return await unless_disconnected(
        request,
        request.app.state.tangram.exec(
            env_id,
            command,
            cpu=demand_arg(body.cpu),
            elastic=body.elastic,
            timeout=body.timeout,
            output_cap=body.output_cap,
            kind=body.kind,
            gpus=None if body.gpus is None else demand_arg(body.gpus),
        ),
    )


@router.post("/v1/services/{name}/invoke", response_model=None, responses=RESULT)
async def invoke(name: str, body: Invoke, request: Request) -> Response:
    return await unless_disconnected(
        request, request.app.state.tangram.invoke(name, body.payload, gpus=demand_arg(body.gpus))
    )


@router.post("/v1/apis/{name}/call", response_model=None, responses=RESULT)
async def call_api(name: str, body: CallApi, request: Request) -> Response:
    return await unless_disconnected(
        request, request.app.state.tangram.call_api(name, body.payload)
    )


@router.get("/v1/status")
async def status(request: Request) -> dict[str, Any]:
    """`Tangram.status()`'s snapshot (`tangram.runtime.status.StatusSnapshot.to_dict`)."""
    return request.app.state.tangram.status().to_dict()


@scrape.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}, 401: {"model": ErrorOut}},
)
async def metrics(request: Request) -> Response:
    return Response(
        request.app.state.tangram.metrics.render(), media_type="text/plain; version=0.0.4"
    )
