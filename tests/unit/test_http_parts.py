"""The HTTP server in parts with one job each (`tangram.runtime.http`): one set of request
limits for the native API and SandboxFusion's endpoints, each of Tangram's errors mapped to
its status code by type, and `tangram.runtime.server` still exporting what users imported."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError as BodyError

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.errors import LimitReached, ShuttingDown, TangramError
from tangram.runtime import server
from tangram.runtime.facade import Tangram
from tangram.runtime.http.limits import MAX_CODE, MAX_ITEMS, MAX_NAME, MAX_TIMEOUT, MAX_UNITS
from tangram.runtime.http.schemas import Exec, OpenEnv
from tangram.runtime.sandboxfusion import RunCodeRequest
from tangram.runtime.sandboxfusion.jupyter import RunJupyterRequest

ROOT = Path(__file__).resolve().parents[2]
PARTS = [ROOT / "tangram/runtime/server.py", *sorted((ROOT / "tangram/runtime/http").glob("*.py"))]


@pytest.mark.parametrize("path", PARTS, ids=lambda p: p.name)
def test_each_parts_functions_fit_a_screen(path):
    """Parts are split by job (docs/architecture.md), not by a line count; a function stays
    short enough to read at once."""
    source = path.read_text()
    long = [
        (n.name, n.end_lineno - n.lineno + 1)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.end_lineno - n.lineno + 1 > 60
    ]
    assert long == []


# -- one set of limits ----------------------------------------------------------------------------
def _refuses(model, **fields) -> bool:
    try:
        model(**fields)
    except BodyError:
        return True
    return False


@pytest.mark.parametrize("over", [False, True])
def test_a_timeout_bound_holds_on_every_endpoint(over):
    t = MAX_TIMEOUT * 2 if over else MAX_TIMEOUT
    assert _refuses(Exec, command="true", timeout=t) is over
    assert _refuses(RunCodeRequest, code="", language="python", run_timeout=t) is over
    assert _refuses(RunCodeRequest, code="", language="python", compile_timeout=t) is over
    assert _refuses(RunJupyterRequest, cells=[], total_timeout=t) is over


@pytest.mark.parametrize("over", [False, True])
def test_demand_code_item_and_name_bounds_are_shared(over):
    n = 1 if over else 0
    assert _refuses(Exec, command="true", cpu=MAX_UNITS + n) is over
    assert _refuses(RunCodeRequest, code="", language="python", cpu=MAX_UNITS + n) is over
    assert _refuses(RunCodeRequest, code="x" * (MAX_CODE + n), language="python") is over
    assert _refuses(RunJupyterRequest, cells=["x" * (MAX_CODE + n)]) is over
    assert (
        _refuses(RunCodeRequest, code="", language="python", fetch_files=["f"] * (MAX_ITEMS + n))
        is over
    )
    assert _refuses(OpenEnv, trajectory="t" * (MAX_NAME + n)) is over
    assert _refuses(RunCodeRequest, code="", language="python", env_id="e" * (MAX_NAME + n)) is over


# -- errors by type -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (
            ShuttingDown("Tangram is closing"),
            503,
        ),  # no "shutting down" in the text: the type counts
        (LimitReached("out of files"), 503),
        (TangramError("the runtime is shutting down"), 400),  # the text alone is no longer a 503
    ],
)
def test_each_error_answers_its_code_by_type(exc, code):
    app = server.create_app(Tangram(cpu=CpuManager(SimCpuBackend())))

    @app.get("/raise")
    async def _raise() -> None:
        raise exc

    async def get() -> httpx.Response:  # the app without its lifespan: nothing starts
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/raise")

    response = asyncio.run(get())
    assert response.status_code == code
    assert set(response.json()) == {"error", "field", "value", "problem"}


def test_the_server_module_still_exports_what_users_imported():
    for name in (
        "BodyLimit",
        "MAX_BODY",
        "BODY_TIMEOUT_S",
        "RedactTokens",
        "create_app",
        "serve_in_thread",
        "main",
        "DrainingServer",
        "error",
        "Exec",
        "ERRORS",
    ):
        assert hasattr(server, name), name
