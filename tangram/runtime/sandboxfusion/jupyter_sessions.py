"""`/run_jupyter` with `session` (our extension of SandboxFusion's request): the cells run in a
persistent kernel kept under that name across requests, so variables survive from one request
to the next (`Tangram.open_kernel`, `run_cell`; docs/sandboxfusion.md).

The first request of a session opens an environment (trajectory `jupyter-session-<name>`,
`memory_limit_MB` or the default) and a kernel in it; later ones reuse both. Each cell is one
action (one core); a cell past `cell_timeout` (or the request past `total_timeout`) is
interrupted, the kernel lives on, and the request ends there (`Failed`, the driver
`TimeLimitExceeded`, the cells so far kept), as SandboxFusion's timeout does. The session ends
when its environment does: the idle reaper's, or a kernel that died (the next request opens a
fresh one). Files and fetched files are the session environment's, kept between requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tangram.errors import TangramError
from tangram.results import Status
from tangram.runtime.sandboxfusion.jupyter import CellRunResult, RunJupyterRequest
from tangram.runtime.sandboxfusion.models import (
    CommandRunResult,
    CommandRunStatus,
    Grants,
    RunJupyterResponse,
    RunStatus,
)

KERNELS = "jupyter-sessions"  # the facade's adapters: session name -> kernel handle
LOCKS = "jupyter-session-locks"


async def run_in_session(
    tg: Any, req: RunJupyterRequest, memory: int, files: dict[str, bytes]
) -> tuple[RunJupyterResponse, str]:
    """Run the request's cells in its session's kernel: (the response, its environment)."""
    locks = tg.adapters.setdefault(LOCKS, {})
    lock = locks.setdefault(req.session, asyncio.Lock())
    async with lock:  # one request of a session at a time (one kernel)
        kernel = await _kernel(tg, req.session, memory)
        env = kernel.split("/", 1)[0]
        if files:
            await tg.write_files(env, files)
        resp = RunJupyterResponse(status=RunStatus.SUCCESS, tangram=Grants(env_id=env))
        deadline = time.monotonic() + req.total_timeout
        timed_out = failed = False
        for code in req.cells:
            left = deadline - time.monotonic()
            limit = min(left, req.cell_timeout) if req.cell_timeout > 0 else left
            if limit <= 0:
                timed_out = True
                break
            cell = await tg.run_cell(kernel, code, timeout=limit)
            resp.cells.append(
                CellRunResult(
                    stdout=cell.stdout, stderr=cell.stderr, display=cell.display, error=cell.error
                )
            )
            if cell.status is Status.TIMEOUT:
                timed_out = True
                break
            if cell.status is not Status.OK:  # the kernel is gone: the session ends with it
                failed = True
                resp.message = cell.detail
                tg.adapters[KERNELS].pop(req.session, None)
                break
        resp.driver = CommandRunResult(
            status=CommandRunStatus.TIME_LIMIT_EXCEEDED
            if timed_out
            else CommandRunStatus.ERROR
            if failed
            else CommandRunStatus.FINISHED,
            return_code=None if timed_out or failed else 0,
        )
        if timed_out or failed:
            resp.status = RunStatus.FAILED if timed_out else RunStatus.SANDBOX_ERROR
        return resp, env


async def _kernel(tg: Any, name: str, memory: int) -> str:
    """The session's kernel: the one it has where its environment is still open, else a new
    environment and kernel."""
    kernels = tg.adapters.setdefault(KERNELS, {})
    kernel = kernels.get(name)
    if kernel is not None:
        try:
            if tg.sessions(kernel.split("/", 1)[0]):
                return kernel
        except TangramError:
            pass  # its environment was closed (the idle reaper)
        kernels.pop(name, None)
    env = await tg.open_env(f"jupyter-session-{name}", memory)
    try:
        kernel = await tg.open_kernel(env)
    except BaseException:
        await asyncio.shield(tg.close_env(env))
        raise
    kernels[name] = kernel
    return kernel
