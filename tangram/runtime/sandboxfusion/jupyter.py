"""SandboxFusion's `POST /run_jupyter`: notebook cells in a kernel of their own, in a sandbox.

One request is one fresh sandbox (from the warm pool, closed after) and one action: the driver
(`jupyter_driver.py`, run with the server's Python, which the sandbox sees read-only) starts an
ipykernel inside the sandbox, runs the cells in order and reports each cell's outputs; the
kernel dies with the request. The shapes are SandboxFusion's: the request `{cells,
cell_timeout (0: none), total_timeout (45 s), memory_limit_MB, kernel: "python3", files,
fetch_files}`, the response `{status, message, driver, cells: [{stdout, stderr, display,
error}], executor_pod_name, files}`; `status` is `Success` when the driver ran every cell (an
exception inside a cell is that cell's `error`, not a failure), `Failed` when a cell or the
whole run timed out (`driver.status` `TimeLimitExceeded`; the cells done so far are kept) or
the driver failed, `SandboxError` when the sandbox could not run it (no ipykernel for the
server's Python, a broken sandbox).

The exec's own limit is `total_timeout` plus the kernel's start-up (`KERNEL_START_S`): the
timeouts of the request count from the first cell, as the kernel's start-up is the server's
cost, not the code's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.results import Result, Status
from tangram.runtime.http.limits import (
    MAX_CODE,
    MAX_ITEMS,
    MAX_MEMORY_MB,
    MAX_TIMEOUT,
    Name,
    Seconds,
)
from tangram.runtime.sandboxfusion.paths import check_fetch, check_files

DRIVER = Path(__file__).with_name("jupyter_driver.py")
DRIVER_NAME = ".tangram-jupyter-driver.py"
REQUEST_NAME = ".tangram-jupyter.json"
RESULT_MARK = "TANGRAM-JUPYTER-RESULT "
KERNEL_START_S = 60.0
OUTPUT_CAP = 16 << 20  # bytes: every cell's outputs travel in the driver's stdout


class RunJupyterRequest(BaseModel):
    """SandboxFusion's request; unknown fields are ignored, as there."""

    model_config = ConfigDict(extra="ignore")

    cells: Annotated[list[Annotated[str, Field(max_length=MAX_CODE)]], Field(max_length=4096)]
    cell_timeout: Annotated[float, Field(ge=0, le=MAX_TIMEOUT, allow_inf_nan=False)] = 0.0
    total_timeout: Seconds = 45.0
    memory_limit_MB: Annotated[int, Field(ge=-1, le=MAX_MEMORY_MB)] = -1
    kernel: Literal["python3"] = "python3"
    files: dict[str, str | None] = Field(default_factory=dict, max_length=MAX_ITEMS)
    fetch_files: list[str] = Field(default_factory=list, max_length=MAX_ITEMS)
    # our extension: the cells run in a kernel kept under this name across requests
    # (`jupyter_sessions`); None: SandboxFusion's semantics, a kernel of the request's own
    session: Name | None = None

    @field_validator("memory_limit_MB")
    @classmethod
    def _memory(cls, v: int) -> int:
        return memory_limit(v)

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        return check_files(v)

    @field_validator("fetch_files")
    @classmethod
    def _fetch(cls, v: list[str]) -> list[str]:
        return check_fetch(v)


def memory_limit(v: int) -> int:
    """`memory_limit_MB` of both SandboxFusion requests: -1 (the server's environment default,
    docs/sandboxfusion.md) or a positive number of MiB."""
    if v == 0:
        raise ValueError("must be -1 (the server's default) or a positive number of MiB")
    return v


class CellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: list[dict[str, Any]]
    error: list[dict[str, Any]]


def driver_files(req: RunJupyterRequest) -> dict[str, bytes]:
    """The driver and its request, as files of the work directory."""
    spec = {
        "cells": req.cells,
        "cell_timeout": req.cell_timeout,
        "total_timeout": req.total_timeout,
    }
    return {DRIVER_NAME: DRIVER.read_bytes(), REQUEST_NAME: json.dumps(spec).encode()}


def driver_command() -> str:
    """The shell command that runs the driver with the server's own Python as the command
    sees it (`TANGRAM_PYTHON`; `-I`: not the work directory's modules, not the
    environment's)."""
    return f'exec "${{TANGRAM_PYTHON:-python3}}" -I {DRIVER_NAME} < /dev/null'


def exec_timeout(req: RunJupyterRequest) -> float:
    return req.total_timeout + KERNEL_START_S


def parse(r: Result) -> tuple[list[CellRunResult], bool | None, str]:
    """The driver's report: (cells, timed out, its stdout without the report line); timed out
    is None when there is no report (the driver did not get that far)."""
    kept, report = [], None
    for line in r.stdout.splitlines(keepends=True):
        if line.startswith(RESULT_MARK):
            report = line[len(RESULT_MARK) :]
        else:
            kept.append(line)
    if report is None:
        return [], None, "".join(kept)
    try:
        doc = json.loads(report)
        cells = [CellRunResult(**c) for c in doc["cells"]]
    except (ValueError, KeyError, TypeError):
        return [], None, "".join(kept)
    return cells, bool(doc["timed_out"]), "".join(kept)


def no_kernel(r: Result) -> bool:
    """The driver could not import jupyter_client/ipykernel in the sandbox."""
    return (
        r.status is Status.ERROR
        and "No module named" in r.stderr
        and ("jupyter_client" in r.stderr or "ipykernel" in r.stderr)
    )


async def shielded_close(tg: Any, env: str) -> None:
    await asyncio.shield(tg.close_env(env))
