"""A SandboxFusion-shaped `/run_code` server with isolation off: the reference `tangram bench
sandboxfusion --latency` holds Tangram's latency and throughput against (goal: median latency
<= 1.0x, 16-client throughput >= 0.9x). SandboxFusion's server is not on the package registries,
so this is our own code doing per request what its runner does with `isolation: none`:

- the request and response models with every field SandboxFusion's have (pydantic);
- a fresh temporary directory per request, the `files` restored there from base64, the code
  written to a file of its own;
- the language's command run by `/bin/bash` through `asyncio.create_subprocess_shell` in a new
  session, `cd` into the folder first, stdin fed and closed, stdout and stderr read to their
  end, the run timed, the session killed at the timeout and after the exit;
- `fetch_files` read back as base64, the outputs decoded leniently, one log line per request.

No scheduler, no sandbox, no memory limit (SandboxFusion's default `memory_limit_MB` -1). Run it
as `python -m evaluation.benches.sf_shaped --port P [--runs-per-core]`: with `--runs-per-core`
at most one program per core runs at a time (the others wait), as Tangram grants whole cores;
without, every request runs at once, as SandboxFusion does by default.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import signal
import sys
import tempfile
import time
import uuid

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, Field

log = logging.getLogger("sf_shaped")
# language -> (source file name, compile command or None, run command), SandboxFusion's lines
COMMANDS = {
    "python": ("tmp_0.py", None, "python3 tmp_0.py"),
    "cpp": ("tmp_0.cpp", "g++ -std=c++17 -o test tmp_0.cpp -lcrypto -lssl -lpthread", "./test"),
}


class RunCodeRequest(BaseModel):
    code: str
    language: str
    compile_timeout: float = 10.0
    run_timeout: float = 10.0
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CommandRunResult(BaseModel):
    status: str
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: str
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace")


async def run_command(
    command: str, cwd: str, timeout: float, stdin: str | None
) -> CommandRunResult:
    proc = await asyncio.create_subprocess_shell(
        f"cd {cwd} && {command}",
        executable="/bin/bash",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    t = time.perf_counter()
    try:
        out, err = await asyncio.wait_for(proc.communicate((stdin or "").encode()), timeout)
    except TimeoutError:
        return CommandRunResult(status="TimeLimitExceeded", execution_time=time.perf_counter() - t)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return CommandRunResult(
        status="Finished",
        execution_time=time.perf_counter() - t,
        return_code=proc.returncode,
        stdout=_decode(out),
        stderr=_decode(err),
    )


def _restore(folder: str, files: dict[str, str | None]) -> None:
    for path, content in files.items():
        if content is None:
            continue
        target = os.path.join(folder, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(base64.b64decode(content))


def _fetch(folder: str, paths: list[str]) -> dict[str, str]:
    out = {}
    for path in paths:
        full = os.path.join(folder, path)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                out[path] = base64.b64encode(f.read()).decode()
    return out


_SLOTS: asyncio.Semaphore | None = None  # one per core with --runs-per-core


async def run_code(req: RunCodeRequest) -> RunCodeResponse:
    if _SLOTS is None:
        return await _run_code(req)
    async with _SLOTS:
        return await _run_code(req)


async def _run_code(req: RunCodeRequest) -> RunCodeResponse:
    source, compile_cmd, run_cmd = COMMANDS[req.language]
    with tempfile.TemporaryDirectory(prefix="sf-shaped-") as d:
        _restore(d, req.files)
        with open(os.path.join(d, source), "w") as f:
            f.write(req.code)
        compiled = ran = None
        if compile_cmd is not None:
            compiled = await run_command(compile_cmd, d, req.compile_timeout, None)
        if compiled is None or compiled.return_code == 0:
            ran = await run_command(run_cmd, d, req.run_timeout, req.stdin)
        files = _fetch(d, req.fetch_files)
    steps = [s for s in (compiled, ran) if s is not None]
    ok = all(s.status == "Finished" and s.return_code == 0 for s in steps)
    return RunCodeResponse(
        status="Success" if ok else "Failed", compile_result=compiled, run_result=ran, files=files
    )


def app() -> FastAPI:
    a = FastAPI()

    @a.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @a.post("/run_code", response_model=RunCodeResponse)
    async def run_code_route(req: RunCodeRequest) -> RunCodeResponse:
        rid = uuid.uuid4().hex[:8]
        t = time.perf_counter()
        resp = await run_code(req)
        log.info(
            "run_code %s %s: %s in %.1f ms",
            rid,
            req.language,
            resp.status,
            (time.perf_counter() - t) * 1e3,
        )
        return resp

    return a


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--runs-per-core", action="store_true")
    ns = p.parse_args()
    global _SLOTS
    if ns.runs_per_core:
        _SLOTS = asyncio.Semaphore(len(os.sched_getaffinity(0)))
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)  # as SandboxFusion, stdout
    uvicorn.run(app(), host="127.0.0.1", port=ns.port, log_level="warning")


if __name__ == "__main__":
    main()
