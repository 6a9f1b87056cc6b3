"""The one error shape of the HTTP API, `{"error", "field", "value", "problem"}`, and which
status code each of Tangram's errors answers (see `tangram.runtime.server`'s table). Every
value echoed is printable UTF-8 and shortened, so an error never leaks a huge payload."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tangram.errors import (
    Infeasible,
    LimitReached,
    NotFound,
    QueueFull,
    ShuttingDown,
    TangramError,
    ValidationError,
    out_of_files,
)
from tangram.runtime.http.schemas import FIELDS

log = logging.getLogger("tangram.runtime.server")


class Unauthorized(Exception):
    """A request without the server's token (raised by the schema's dependency)."""


def printable(text: str) -> str:
    """`text` that UTF-8 can carry: a lone surrogate (valid in a JSON string escape, not in
    UTF-8) is written as its escape, `\\ud800`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_value(v: Any, limit: int = 200) -> Any:
    """The offending value as JSON, shortened so an error never echoes a huge payload (and
    as text where JSON cannot hold it: inf, NaN, bytes, lone surrogates)."""
    if isinstance(v, str):
        v = printable(v)
        return v if len(v) <= limit else v[:limit] + "..."
    try:
        text = json.dumps(v, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")
    except (TypeError, ValueError):
        return printable(repr(v))[:limit]
    return v if len(text) <= limit else text[:limit] + "..."


def error(
    status: int,
    message: str,
    field: str | None = None,
    value: Any = None,
    problem: str | None = None,
) -> JSONResponse:
    body = {
        "error": printable(message),
        "field": None if field is None else printable(field),
        "value": json_value(value),
        "problem": None if problem is None else printable(problem),
    }
    return JSONResponse(jsonable_encoder(body), status_code=status)


def unauthorized() -> JSONResponse:
    response = error(
        401,
        "missing or wrong bearer token",
        "authorization",
        problem='send "Authorization: Bearer <token>" or ?token=<token>',
    )
    response.headers["www-authenticate"] = "Bearer"
    return response


def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    """`NotFound` (an environment, service or API that is not there) is 404; the rest 422."""
    assert isinstance(exc, ValidationError)
    return error(
        404 if isinstance(exc, NotFound) else 422, str(exc), exc.field, exc.value, exc.problem
    )


def _infeasible(request: Request, exc: Exception) -> JSONResponse:
    field = {"exec": "cpu", "run_code": "cpu", "invoke": "gpus"}.get(
        request.url.path.rsplit("/", 1)[-1]
    )
    return error(409, str(exc), field, problem="no pool can ever meet this demand")


def _queue_full(_: Request, exc: Exception) -> JSONResponse:
    response = error(429, str(exc), "queue", problem="the scheduler's queue is full")
    response.headers["Retry-After"] = "1"
    return response


SHUTTING_DOWN = "the runtime is shutting down"  # a 503's problem (the other: a host limit)


def _limit_reached(_: Request, exc: Exception) -> JSONResponse:
    response = error(503, str(exc), problem="a limit of the host was reached")
    response.headers["Retry-After"] = "1"
    return response


def _shutting_down(_: Request, exc: Exception) -> JSONResponse:
    return error(503, str(exc), problem=SHUTTING_DOWN)


def _tangram_error(_: Request, exc: Exception) -> JSONResponse:
    return error(400, str(exc))


def _named_field(errs: list[dict[str, Any]]) -> tuple[str, int]:
    """The first error's field as the body names it (`cpu`, `cpu.min`), and how many parts of
    its location that covers (its `body`/`path`/... prefix included)."""
    full = tuple(errs[0].get("loc", ()))
    skip = 1 if full and full[0] in ("body", "path", "query", "header") else 0
    named = []
    for part in full[skip:]:  # stop at a union branch's tag ("constrained-int", "UnitRange")
        if not (isinstance(part, int) or part in FIELDS or errs[0]["type"] == "extra_forbidden"):
            break
        named.append(str(part))
    return ".".join(named) or "body", skip + len(named)


def _request_error(_: Request, exc: Exception) -> JSONResponse:
    """The first bad field, named as in the body (`cpu`, `cpu.min`); a value that matches no
    form of a union (a demand: int, range or list) lists why each form refused it."""
    assert isinstance(exc, RequestValidationError)
    errs = list(exc.errors()) or [{"loc": (), "msg": "invalid request", "type": "?"}]
    if errs[0].get("type") == "json_invalid":  # its loc is a character offset, not a field
        at = next((p for p in errs[0].get("loc", ()) if isinstance(p, int)), None)
        problem = "not valid JSON" + (f" (at character {at})" if at is not None else "")
        return error(422, f"body: {problem}", "body", None, problem)
    field, k = _named_field(errs)
    full = tuple(errs[0].get("loc", ()))
    branches = [e for e in errs if tuple(e.get("loc", ()))[:k] == full[:k] and len(e["loc"]) > k]
    if len(branches) > 1:
        problem = "matches no accepted form: " + "; ".join(
            f"as {e['loc'][k]}: {e.get('msg')}" for e in branches[:4]
        )
    else:
        problem = str(errs[0].get("msg", "invalid"))
    return error(422, f"{field}: {problem}", field, errs[0].get("input"), problem)


def _http_error(_: Request, exc: Exception) -> JSONResponse:
    """Starlette's own (no such path, method not allowed) in the same error shape."""
    assert isinstance(exc, StarletteHTTPException)
    response = error(
        exc.status_code, str(exc.detail), "path" if exc.status_code in (404, 405) else None
    )
    response.headers.update(exc.headers or {})
    return response


def _internal(request: Request, exc: Exception) -> JSONResponse:
    limit = out_of_files(exc)  # wherever it was met: a 503 naming the limit, not a 500
    if limit is not None:
        log.warning("%s %s: %s", request.method, request.url.path, limit)
        return _limit_reached(request, limit)
    log.exception("internal error", exc_info=exc)
    return error(500, f"internal error: {type(exc).__name__}: {exc}")


def _on_loop(handler: Callable[[Request, Exception], Response]):
    """`handler` as a coroutine: Starlette runs a plain function in a worker thread through
    anyio, which imports its thread backend on first use; with no file descriptor left (the
    very error `_internal` turns into a 503) that import failed and the client got a bare
    500. Every handler here is quick and never blocks, so it runs on the loop."""

    async def handle(request: Request, exc: Exception) -> Response:
        return handler(request, exc)

    return handle


def install_handlers(app: FastAPI) -> None:
    """Answer every error in the one shape: the most specific class's handler wins."""
    handlers: list[tuple[type[Exception], Callable[[Request, Exception], Response]]] = [
        (Unauthorized, lambda r, e: unauthorized()),
        (ValidationError, _validation_error),
        (Infeasible, _infeasible),
        (QueueFull, _queue_full),
        (LimitReached, _limit_reached),
        (ShuttingDown, _shutting_down),
        (TangramError, _tangram_error),
        (RequestValidationError, _request_error),
        (StarletteHTTPException, _http_error),
        (Exception, _internal),
    ]
    for kind, handler in handlers:
        app.add_exception_handler(kind, _on_loop(handler))
