"""The HTTP routes: `/run_code`, `/run_jupyter`, the SDK's form and what is not served."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from tangram.runtime.sandboxfusion.jupyter import RunJupyterRequest
from tangram.runtime.sandboxfusion.models import RunCodeRequest, RunCodeResponse, RunJupyterResponse
from tangram.runtime.sandboxfusion.work import run_code, run_jupyter

log = logging.getLogger("tangram.runtime.sandboxfusion")
T = TypeVar("T")


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work` while listening for the client going away; if it does, cancel the work (its
    queued actions are dropped, a fresh environment is closed) and return None. The work runs
    in the request's own task (one task per request fewer than a task of its own): the
    listener cancels that task, and only its cancellation is taken back here."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def listen() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watch = asyncio.ensure_future(listen())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:  # the server's own cancellation (shutting down): not ours to take back
            raise
        task.uncancel()
        log.info("/run_code: client disconnected; its work was cancelled")
        return None
    finally:
        watch.cancel()


async def _answered(request: Request, work: Awaitable[BaseModel]) -> Response:
    """`work`'s response as JSON, serialised by pydantic in one pass (not a dict, then
    `json`); 499 when the client went away (`cancel_on_disconnect`)."""
    resp = await cancel_on_disconnect(request, work)
    if resp is None:
        return Response(status_code=499)
    return Response(resp.model_dump_json(), media_type="application/json")


router = APIRouter(tags=["sandboxfusion"])  # /run_code first: the routes are matched in order


@router.post("/run_code", response_model=RunCodeResponse)
async def run_code_route(body: RunCodeRequest, request: Request) -> Response:
    """SandboxFusion's `/run_code`: see `tangram.runtime.sandboxfusion`."""
    # the runtime's refusals (unknown env_id, a demand no pool meets, shutting down) raise
    # `TangramError`s, which the app answers as everywhere else (404, 409, 422, 503)
    return await _answered(request, run_code(request.app.state.tangram, body))


@router.post("/run_jupyter", response_model=RunJupyterResponse)
async def run_jupyter_route(body: RunJupyterRequest, request: Request) -> Response:
    """SandboxFusion's `/run_jupyter`: see `tangram.runtime.sandboxfusion.jupyter`."""
    return await _answered(request, run_jupyter(request.app.state.tangram, body))


# SandboxFusion's dataset and judge endpoints, which its SDK calls (`get_prompts`, `submit`,
# ...): the datasets are SandboxFusion's own content, not served here.
UNSERVED = (
    "/get_prompts",
    "/get_prompt_by_id",
    "/submit",
    "/list_datasets",
    "/list_ids",
    "/get_metrics",
    "/get_metrics_function",
)


def unserved(path: str) -> JSONResponse:
    """A JSON 404 naming what is not served (a client's request for something this server
    does not have, not a server failure)."""
    return JSONResponse(
        status_code=404,
        content={
            "error": f"{path} is not served by Tangram",
            "field": "path",
            "value": path,
            "problem": "SandboxFusion's dataset and judge endpoints are not implemented; "
            "/run_code and /run_jupyter are",
        },
    )


async def _unserved(request: Request) -> JSONResponse:
    return unserved(request.url.path)


for _path in UNSERVED:
    router.add_api_route(_path, _unserved, methods=["GET", "POST"], include_in_schema=False)


@router.post("/", include_in_schema=False)
async def sdk_dispatch(request: Request) -> Response:
    """The SandboxFusion SDK appends the function's path to its endpoint and sends no auth
    header; with `endpoint="http://host:port/?token=T&_="` the path lands in the query
    (`/?token=T&_=/run_code`) and the token with it, for every SDK function."""
    path = request.query_params.get("_", "")
    if path not in ("/run_code", "/run_jupyter"):
        return unserved(path or "/")
    try:
        doc = await request.json()
        body: Any = (RunCodeRequest if path == "/run_code" else RunJupyterRequest)(**doc)
    except (ValueError, TypeError) as exc:
        from_error = getattr(exc, "errors", None)
        problem = str(from_error()[0]["msg"]) if callable(from_error) else str(exc)
        return JSONResponse(
            status_code=422,
            content={
                "error": "invalid request body",
                "field": "body",
                "value": None,
                "problem": problem,
            },
        )
    if path == "/run_code":
        return await run_code_route(body, request)
    return await run_jupyter_route(body, request)
