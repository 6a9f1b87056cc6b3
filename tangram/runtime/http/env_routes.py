"""The HTTP routes of environments' trees: fork, snapshots, files in and out.

    POST   /v1/envs/{env_id}/fork        {"trajectories": [...]}   -> {"env_ids": [...]}
    POST   /v1/envs/{env_id}/snapshot                              -> {"snapshot_id"}
    GET    /v1/snapshots                                           -> {"snapshots": [...]}
    DELETE /v1/snapshots/{snapshot_id}                             -> {"snapshot_id"}
    PUT    /v1/envs/{env_id}/files       {"files": {path: base64}} -> {"written": n}
    POST   /v1/envs/{env_id}/files/read  {"paths": [...]}          -> {"files": {path: base64|null}}
    GET    /v1/envs/{env_id}/files/tar?path=/sandbox               -> a tar stream of that folder

`POST /v1/envs` itself (in `server`) takes `image`, `disk_mb` and `snapshot`. A path is as in
`Tangram.write_files`: absolute = the environment's own root (with an image), relative = under
its work folder. A whole request body is at most `limits.MAX_BODY` (1 MiB): bigger files go
in several requests. Errors have the server's shape (422 naming the field, 404 for an unknown
environment or snapshot).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from tangram.errors import TangramError, ValidationError
from tangram.runtime.http.limits import MAX_FORK, MAX_ITEMS, FilePath, Name
from tangram.runtime.http.owned import not_pooled

log = logging.getLogger(__name__)
router = APIRouter(tags=["environments"], dependencies=[Depends(not_pooled)])


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Fork(_Body):
    trajectories: Annotated[list[Name], Field(min_length=1, max_length=MAX_FORK)]


class WriteFiles(_Body):
    files: Annotated[dict[FilePath, str], Field(max_length=MAX_ITEMS)]


class ReadFiles(_Body):
    paths: Annotated[list[FilePath], Field(min_length=1, max_length=MAX_ITEMS)]


class ForkOut(BaseModel):
    env_ids: list[str]


class SnapshotOut(BaseModel):
    snapshot_id: str


FIELDS = set(Fork.model_fields) | set(WriteFiles.model_fields) | set(ReadFiles.model_fields)


def _decoded(files: dict[str, str]) -> dict[str, bytes]:
    out = {}
    for path, text in files.items():
        try:
            out[path] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValidationError(f"files.{path}", text, "must be base64") from None
    return out


@router.post("/v1/envs/{env_id}/fork")
async def fork_env(env_id: str, body: Fork, request: Request) -> ForkOut:
    return ForkOut(env_ids=await request.app.state.tangram.fork_env(env_id, body.trajectories))


@router.post("/v1/envs/{env_id}/snapshot")
async def snapshot(env_id: str, request: Request) -> SnapshotOut:
    return SnapshotOut(snapshot_id=await request.app.state.tangram.snapshot(env_id))


@router.get("/v1/snapshots")
async def snapshots(request: Request) -> dict[str, Any]:
    return {"snapshots": request.app.state.tangram.snapshots()}


@router.delete("/v1/snapshots/{snapshot_id}")
async def delete_snapshot(snapshot_id: str, request: Request) -> SnapshotOut:
    await request.app.state.tangram.delete_snapshot(snapshot_id)
    return SnapshotOut(snapshot_id=snapshot_id)


@router.put("/v1/envs/{env_id}/files")
async def write_files(env_id: str, body: WriteFiles, request: Request) -> dict[str, int]:
    files = _decoded(body.files)
    await request.app.state.tangram.write_files(env_id, files)
    return {"written": len(files)}


@router.post(
    "/v1/envs/{env_id}/files/read",
    response_class=Response,
    responses={200: {"content": {"application/json": {}}}},
)
async def read_files(env_id: str, body: ReadFiles, request: Request) -> Response:
    """`{"files": {path: base64 | null}}`, streamed: each file's base64 is made in pieces of
    `PIECE` bytes, a large piece in a worker thread, and sent as it is made, so a large answer
    (up to the 256 MiB bound of a call) never holds the event loop (nor the interpreter's
    lock) for longer than one piece, and other clients are served meanwhile."""
    got = await request.app.state.tangram.read_files(env_id, body.paths)
    return StreamingResponse(_answer(got), media_type="application/json")


PIECE = 3 << 20  # bytes of a file encoded at once (a multiple of 3: the pieces concatenate)
INLINE = 64 << 10  # a piece at most this large is encoded on the loop (a thread hop costs more)


async def _answer(got: dict[str, bytes | None]) -> AsyncIterator[bytes]:
    yield b'{"files": {'
    for i, (path, data) in enumerate(got.items()):
        yield (b", " if i else b"") + json.dumps(path).encode() + b": "
        if data is None:
            yield b"null"
            continue
        view = memoryview(data)
        yield b'"'
        for at in range(0, len(view), PIECE):
            piece = view[at : at + PIECE]
            yield (
                _encoded(piece)
                if len(piece) <= INLINE
                else await asyncio.to_thread(_encoded, piece)
            )
        yield b'"'
    yield b"}}"


def _encoded(piece: memoryview) -> bytes:
    return base64.b64encode(piece)


@router.get(
    "/v1/envs/{env_id}/files/tar",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}}},
)
async def tar_files(env_id: str, request: Request, path: str = "/sandbox") -> StreamingResponse:
    """The folder's tar stream. Refusals (an unknown environment, a bad path, an archive over
    `cpu.tar_max_mb`) come before the 200; one that grows past the bound while it streams
    is cut, and the connection closed with the response unfinished (the client's read fails)."""
    stream = request.app.state.tangram.tar_files(env_id, path)
    first = await anext(stream, b"")

    async def body():
        yield first
        async for chunk in stream:
            yield chunk

    return _CutStream(body(), media_type="application/x-tar")


class _CutStream(StreamingResponse):
    """A stream that a `TangramError` cuts: logged, and the response left unfinished (so the
    server closes the connection and the client cannot take a cut archive for a whole one)."""

    async def stream_response(self, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except TangramError as exc:
            log.warning("a files/tar stream was cut: %s", exc)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
