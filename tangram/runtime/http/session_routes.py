"""Shell sessions over HTTP (`Tangram.open_session`, `run`, `close_session`):

    POST   /v1/envs/{env_id}/sessions              {"name"}                  -> {"session"}
    GET    /v1/envs/{env_id}/sessions                                        -> {"sessions"}
    POST   /v1/envs/{env_id}/sessions/{name}/run   {"command", "cpu", "elastic", "timeout",
                                                    "output_cap", "interactive", "expect"}
                                                                             -> Result
    DELETE /v1/envs/{env_id}/sessions/{name}                                 -> {"session"}

    POST   /v1/envs/{env_id}/kernels                                         -> {"kernel"}
    POST   /v1/envs/{env_id}/kernels/{name}/cells  {"code", "cpu", "timeout"} -> Cell
    DELETE /v1/envs/{env_id}/kernels/{name}                                  -> {"kernel"}

A command that ran answers 200 with its Result (a timeout is `timeout`, the session alive; a
shell that is gone is `failed`, naming how it went); a bad name, an unknown session or
environment is the usual 4xx (`tangram.runtime.http.errors`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.runtime.http.limits import (
    MAX_CODE,
    MAX_COMMAND,
    MAX_ITEMS,
    MAX_OUTPUT_CAP,
    Name,
    Seconds,
)
from tangram.runtime.http.owned import not_pooled
from tangram.runtime.http.routes import RESULT, unless_disconnected
from tangram.runtime.http.schemas import Demand, demand_arg

router = APIRouter(tags=["sessions"], dependencies=[Depends(not_pooled)])


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class OpenSession(_Body):
    name: Name = "default"


class Run(_Body):
    command: Annotated[str, Field(max_length=MAX_COMMAND)]
    cpu: Demand = 1
    elastic: bool = False
    timeout: Seconds = 60.0
    output_cap: Annotated[int, Field(ge=0, le=MAX_OUTPUT_CAP)] | None = None
    interactive: bool = False
    expect: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=MAX_ITEMS)
    ] = []
    kind: Name | None = None

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("must not contain NUL characters")
        return v


class SessionOut(BaseModel):
    session: str


class SessionsOut(BaseModel):
    sessions: list[str]


@router.post("/v1/envs/{env_id}/sessions", response_model=SessionOut)
async def open_session(env_id: str, body: OpenSession, request: Request) -> dict:
    name = await request.app.state.tangram.open_session(env_id, body.name)
    return {"session": name}


@router.get("/v1/envs/{env_id}/sessions", response_model=SessionsOut)
async def sessions(env_id: str, request: Request) -> dict:
    return {"sessions": request.app.state.tangram.sessions(env_id)}


@router.post("/v1/envs/{env_id}/sessions/{name}/run", response_model=None, responses=RESULT)
async def run(env_id: str, name: str, body: Run, request: Request) -> Response:
    return await unless_disconnected(
        request,
        request.app.state.tangram.run(
            env_id,
            name,
            body.command,
            demand_arg(body.cpu),
            body.elastic,
            body.timeout,
            body.output_cap,
            interactive=body.interactive,
            expect=body.expect,
            kind=body.kind,
        ),
    )


@router.delete("/v1/envs/{env_id}/sessions/{name}", response_model=SessionOut)
async def close_session(env_id: str, name: str, request: Request) -> dict:
    await request.app.state.tangram.close_session(env_id, name)
    return {"session": name}


class RunCell(_Body):
    code: Annotated[str, Field(max_length=MAX_CODE)]
    cpu: Demand = 1
    timeout: Seconds = 60.0


class KernelOut(BaseModel):
    kernel: str


@router.post("/v1/envs/{env_id}/kernels", response_model=KernelOut)
async def open_kernel(env_id: str, request: Request) -> dict:
    handle = await request.app.state.tangram.open_kernel(env_id)
    return {"kernel": handle.split("/", 1)[1]}


@router.post("/v1/envs/{env_id}/kernels/{name}/cells")
async def run_cell(env_id: str, name: str, body: RunCell, request: Request) -> dict:
    cell = await request.app.state.tangram.run_cell(
        f"{env_id}/{name}", body.code, demand_arg(body.cpu), body.timeout
    )
    return cell.to_dict()


@router.delete("/v1/envs/{env_id}/kernels/{name}", response_model=KernelOut)
async def close_kernel(env_id: str, name: str, request: Request) -> dict:
    await request.app.state.tangram.close_kernel(f"{env_id}/{name}")
    return {"kernel": name}
