"""SandboxFusion's `POST /run_code` on Tangram: every SandboxFusion client switches by its URL.

verl's code rewards and tools, SkyRL's code interpreter and other clients POST
`{code, language, compile_timeout, run_timeout, memory_limit_MB, stdin, files, fetch_files}`
to a SandboxFusion server and read `{status, message, compile_result, run_result, files}`.
Here one such request is Tangram work in one environment: a fresh one (opened for the request,
closed after it, whatever happens) or, with the extension field `env_id`, an environment the
caller opened (multi-turn tools: files persist between calls). Each step is one action:

    compile  (compiled languages)  1 core, `compile_timeout`
    run                            the request's `cpu` demand (default 1), `run_timeout`;
                                   `elastic` (default: pytest with more than one allowed amount)
                                   gives a pytest run its granted cores as workers
    fetch    (`fetch_files` only)  1 core: the files come back as base64

Inputs (`files`, the code, `stdin`) travel inside the first step's argv as base64 and are
written in the environment's work directory before the step runs, so the same request works on
every CPU backend (local, Docker, a Ray node elsewhere). SandboxFusion's semantics: `status` is
`Success` when every step finished with return code 0, `Failed` when one timed out or returned
non-zero (the run is skipped after a failed compile), `SandboxError` when a step could not run
(`message` says why); a language SandboxFusion knows but this server cannot run (no toolchain)
is a `SandboxError`, a language SandboxFusion does not know is a 422, as in SandboxFusion.
The response also carries `tangram` (an extension clients ignore): each step's grant.

Also served: `/run_jupyter` (`jupyter`), and, for SandboxFusion's SDK, which appends each
function's path to its endpoint and sends no auth header, `POST /?token=T&_=/run_code` (the
endpoint `http://host:port/?token=T&_=`); its dataset endpoints answer a JSON 404 saying they
are not served. A fresh request takes a never-used sandbox from a warm pool (`warm`); the
runners' command lines are SandboxFusion's (`runners`). See docs/sandboxfusion.md for every
difference kept on purpose.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import posixpath
import re
from collections.abc import Awaitable
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.errors import ValidationError
from tangram.results import Result, Status
from tangram.runtime.sandboxfusion import jupyter
from tangram.runtime.sandboxfusion.jupyter import CellRunResult, RunJupyterRequest
from tangram.runtime.sandboxfusion.runners import Plan, missing_toolchain, plan_for
from tangram.runtime.sandboxfusion.warm import fresh_trajectory, warm_pool

log = logging.getLogger("tangram.runtime.sandboxfusion")

T = TypeVar("T")

# an environment's memory when the request says -1 (no per-request limit): the server's default
DEFAULT_MEMORY_MB = int(os.environ.get("TANGRAM_SANDBOXFUSION_MEMORY_MB", "1024"))
ISOLATING_BACKENDS = ("bwrap", "docker")  # a root of its own per sandbox
IGNORED_FILE = "IGNORE_THIS_FILE"  # SandboxFusion skips `files` whose name holds this
FETCH_TIMEOUT = 30.0  # s, the step that reads `fetch_files` back
FETCH_CAP = 8 << 20  # bytes of base64 a fetch step may print
ARG_CHUNK = 64 << 10  # bytes of base64 per argv element (Linux caps one element at 128 KiB)
STDIN_FILE = ".tangram-stdin"
MAX_TIMEOUT = 24 * 3600.0
OOM_DETAIL = "killed: out of memory"  # how the CPU backends name a memory kill

# Every language SandboxFusion's request model accepts; anything else is a 422 there and here.
SandboxLanguage = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
    "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket"]


# -- the request ---------------------------------------------------------------------------------

Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)]
Units = Annotated[int, Field(ge=1, le=1 << 20)]


class CpuRange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min: Units
    max: Units


def _sandbox_path(path: str) -> str:
    """A path inside the sandbox, normalised: relative to its work directory, or absolute (in
    the sandbox's own view: its private /tmp, its work directory; see `absolute_allowed`);
    ValueError when a relative one escapes the work directory or it cannot be a file name."""
    if not path or "\x00" in path or "\\" in path:
        raise ValueError(f"{path!r} is not a file path")
    norm = posixpath.normpath(path)
    if path.startswith("/"):
        if norm in ("/", "//"):
            raise ValueError(f"{path!r} is not a file path")
        return norm
    if norm in (".", "") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"{path!r} escapes the sandbox's work directory")
    return norm


def _inside(path: str) -> str:
    """The path as the sandbox's shell names it."""
    return path if path.startswith("/") else "./" + path


def absolute_allowed(tg: Any) -> bool:
    """Absolute `files`/`fetch_files` paths are served only where the backend gives each
    sandbox a root of its own (bwrap, docker): there they name the sandbox's own files and its
    user's permissions bound what it may write. Elsewhere they would be the host's: refused."""
    cpu = getattr(tg, "cpu", None)
    return getattr(getattr(cpu, "backend", None), "name", "") in ISOLATING_BACKENDS


class RunCodeRequest(BaseModel):
    """SandboxFusion's request, plus Tangram's optional extensions (`cpu`, `elastic`,
    `env_id`). Unknown fields are ignored, as SandboxFusion does."""

    model_config = ConfigDict(extra="ignore")

    code: Annotated[str, Field(max_length=1 << 20)]
    language: SandboxLanguage
    compile_timeout: Seconds = 10.0
    run_timeout: Seconds = 10.0
    memory_limit_MB: Annotated[int, Field(ge=-1, le=1 << 24)] = -1
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict, max_length=1024)
    fetch_files: list[str] = Field(default_factory=list, max_length=1024)
    args: list[str] = Field(default_factory=list, max_length=1024,
                            description="extra arguments of a pytest run")
    # Tangram's extensions
    cpu: Units | CpuRange | Annotated[list[Units], Field(min_length=1, max_length=1024)] = Field(
        1, description="the run step's CPU demand: cores, {min, max} or a list of amounts")
    elastic: bool | None = Field(None, description="give a pytest run its granted cores as "
                                 "workers (default: when `cpu` allows more than one amount)")
    env_id: str | None = Field(None, max_length=256, description="run in this open environment "
                               "(multi-turn) instead of a fresh one, which is not closed")

    @field_validator("code", "stdin")
    @classmethod
    def _unicode(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"must be valid Unicode (a lone surrogate at character "
                                 f"{exc.start})") from None
        return v

    @field_validator("memory_limit_MB")
    @classmethod
    def _memory(cls, v: int) -> int:
        return jupyter.memory_limit(v)

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        for path, content in v.items():
            _sandbox_path(path)
            if content is not None:
                try:
                    base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise ValueError(f"{path!r}: content is not base64 ({exc})") from None
        return v

    @field_validator("fetch_files")
    @classmethod
    def _fetch(cls, v: list[str]) -> list[str]:
        for path in v:
            _sandbox_path(path)
        return v

    def cpu_demand(self) -> Any:
        """The demand as the Python API takes it."""
        return (self.cpu.min, self.cpu.max) if isinstance(self.cpu, CpuRange) else self.cpu

    def is_elastic(self) -> bool:
        if self.elastic is not None:
            return self.elastic
        flexible = isinstance(self.cpu, CpuRange | list) and self.cpu_demand() not in ([1], (1, 1))
        return self.language == "pytest" and flexible


FIELDS = set(RunCodeRequest.model_fields) | set(CpuRange.model_fields) \
    | set(RunJupyterRequest.model_fields)


# -- the response --------------------------------------------------------------------------------


class CommandRunStatus(StrEnum):
    FINISHED = "Finished"  # the command ran to its end (any return code)
    ERROR = "Error"  # it could not run: the sandbox failed, not the code
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"  # killed at its timeout


class RunStatus(StrEnum):
    SUCCESS = "Success"  # every step finished with return code 0
    FAILED = "Failed"  # a step timed out or returned non-zero
    SANDBOX_ERROR = "SandboxError"  # a step could not run; `message` says why


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class StepGrant(BaseModel):
    step: str
    action_id: str
    cores: int
    placement: dict[str, Any]
    queued_s: float
    run_s: float


class Grants(BaseModel):
    env_id: str | None = None
    steps: list[StepGrant] = []


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}
    tangram: Grants = Field(default_factory=Grants)


def command_result(r: Result) -> CommandRunResult:
    """A Tangram result as a SandboxFusion step: a timeout has no return code (as there); a
    kill for memory keeps its return code and says so on stderr (where SandboxFusion's clients
    look: there a memory limit surfaces as the program's own MemoryError text); a missing
    toolchain (the runners' guard) is an `Error`, so the request is a `SandboxError`."""
    if r.status is Status.TIMEOUT:
        return CommandRunResult(status=CommandRunStatus.TIME_LIMIT_EXCEEDED,
                                execution_time=r.run_s, stdout=r.stdout, stderr=r.stderr)
    missing = missing_toolchain(r.exit_code, r.stderr)
    if missing is not None:
        return CommandRunResult(status=CommandRunStatus.ERROR, execution_time=r.run_s,
                                stdout=r.stdout, stderr=missing)
    if r.status in (Status.OK, Status.ERROR) and r.exit_code is not None:
        stderr = r.stderr
        if r.detail.startswith(OOM_DETAIL):
            stderr = f"{stderr}{'' if not stderr or stderr.endswith(chr(10)) else chr(10)}" \
                     f"tangram: {r.detail}\n"
        return CommandRunResult(status=CommandRunStatus.FINISHED, execution_time=r.run_s,
                                return_code=r.exit_code, stdout=r.stdout, stderr=stderr)
    return CommandRunResult(status=CommandRunStatus.ERROR, execution_time=r.run_s,
                            stdout=r.stdout, stderr=r.stderr or f"{r.status}: {r.detail}")


def overall(*steps: CommandRunResult | None) -> tuple[RunStatus, str]:
    """SandboxFusion's rule: an Error step makes a SandboxError (its stderr the message); a
    timeout or a non-zero return code a Failed; else Success."""
    ran = [s for s in steps if s is not None]
    for s in ran:
        if s.status is CommandRunStatus.ERROR:
            return RunStatus.SANDBOX_ERROR, s.stderr or "the sandbox failed"
    if any(s.status is CommandRunStatus.TIME_LIMIT_EXCEEDED for s in ran):
        return RunStatus.FAILED, ""
    if any(s.return_code not in (0, None) for s in ran):
        return RunStatus.FAILED, ""
    return RunStatus.SUCCESS, ""


# -- the work ------------------------------------------------------------------------------------

# Writes its (path, base64 chunk) argument pairs up to "--" (a path's first chunk truncates the
# file; one process per chunk: base64), then runs the shell command after "--" in this same
# shell (no second shell start inside the timed step).
_STAGE = r"""set -e
prev=
while [ "$#" -gt 1 ] && [ "$1" != "--" ]; do
  d=${1%/*}
  case "$d" in ""|.|"$1") ;; *) mkdir -p -- "$d" ;; esac
  if [ "$1" != "$prev" ]; then : > "$1"; fi
  base64 -d >> "$1" <<TANGRAM_EOF
$2
TANGRAM_EOF
  prev=$1
  shift 2
done
shift
set +e
eval "$1"
"""

# An elastic pytest run gets its granted cores as pytest-xdist workers from the grant's pytest
# plugin (managers/cpu/pytest_grant: the one home of that rule), loaded in every elastic exec;
# `$workers` stays empty here.
_WORKERS = "workers=; "

# Prints "<index> <base64>" for each argument that is a regular file; missing ones are left out.
_FETCH = r"""i=0
for f; do
  if [ -f "$f" ]; then printf '%s ' "$i"; base64 -w 0 -- "$f"; echo; fi
  i=$((i + 1))
done
"""


def staged(files: dict[str, bytes], command: str) -> list[str]:
    """An argv that writes `files` (work-directory-relative or the sandbox's absolute paths)
    then runs the shell `command`."""
    argv = ["sh", "-c", _STAGE, "tangram-stage"]
    for path, data in files.items():
        text = base64.b64encode(data).decode()
        for i in range(0, max(len(text), 1), ARG_CHUNK):
            argv += [_inside(path), text[i:i + ARG_CHUNK]]
    return [*argv, "--", command]


def fetched(paths: list[str], stdout: str) -> dict[str, str]:
    """The fetch step's output as {requested path: base64}; lines that do not parse (a
    backend that runs nothing, a truncated stream) are left out."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        index, _, data = line.partition(" ")
        if index.isdigit() and int(index) < len(paths) and re.fullmatch(r"[A-Za-z0-9+/=]*", data):
            out[paths[int(index)]] = data
    return out


def _grant(step: str, r: Result) -> StepGrant:
    return StepGrant(step=step, action_id=r.action_id, cores=int(r.units.get("cpu", 0)),
                     placement=dict(r.placement.get("cpu") or {}), queued_s=r.queued_s,
                     run_s=r.run_s)


async def run_code(tg: Any, req: RunCodeRequest) -> RunCodeResponse:
    """Run one request on `tg` (a `Tangram`): see the module docstring. A fresh environment is
    closed before this returns, also when it is cancelled."""
    plan = plan_for(req.language, req.code, list(req.files), req.args)
    if isinstance(plan, str):
        return RunCodeResponse(status=RunStatus.SANDBOX_ERROR, message=plan)
    paths = [*req.files, *req.fetch_files]
    if any(p.startswith("/") for p in paths) and not absolute_allowed(tg):
        bad = next(p for p in paths if p.startswith("/"))
        raise ValidationError("files" if bad in req.files else "fetch_files", bad,
                              "absolute paths are served only by the isolating backends "
                              f"({', '.join(ISOLATING_BACKENDS)}), where they are the "
                              "sandbox's own; give a path relative to the work directory")
    memory = DEFAULT_MEMORY_MB if req.memory_limit_MB == -1 else req.memory_limit_MB
    if req.env_id is not None:
        return await _steps(tg, req.env_id, plan, req)
    pool = warm_pool(tg, DEFAULT_MEMORY_MB)
    if pool is None:
        env = await tg.open_env(fresh_trajectory(), memory)
        try:
            return await _steps(tg, env, plan, req)
        finally:
            await asyncio.shield(tg.close_env(env))
    env = await pool.take(memory)
    try:
        return await _steps(tg, env, plan, req)
    finally:
        pool.release(env)  # closed (and the pool refilled) once the response is on its way


def _inputs(plan: Plan, req: RunCodeRequest) -> dict[str, bytes]:
    files = {**plan.extra}
    files.update({_sandbox_path(p): base64.b64decode(c) for p, c in req.files.items()
                  if c is not None and IGNORED_FILE not in p})
    if plan.source is not None:
        files[plan.source] = (plan.code_prefix + req.code).encode()
    if req.stdin is not None:
        files[STDIN_FILE] = req.stdin.encode()
    return files


async def _steps(tg: Any, env: str, plan: Plan, req: RunCodeRequest) -> RunCodeResponse:
    files = _inputs(plan, req)
    stdin = f"< {STDIN_FILE}" if req.stdin is not None else "< /dev/null"
    guard = plan.guard()
    resp = RunCodeResponse(status=RunStatus.SUCCESS, tangram=Grants(env_id=env))
    if plan.compile is not None:
        r = await tg.exec(env, staged(files, f"{guard}{plan.compile} < /dev/null"), cpu=1,
                          timeout=req.compile_timeout, kind=f"run_code:{req.language}:compile")
        resp.tangram.steps.append(_grant("compile", r))
        resp.compile_result = command_result(r)
        files, guard = {}, ""
    compiled = resp.compile_result is None or (
        resp.compile_result.status is CommandRunStatus.FINISHED
        and resp.compile_result.return_code == 0)
    if compiled:
        elastic = req.language == "pytest" and req.is_elastic()
        r = await tg.exec(env, staged(files, f"{guard}{_WORKERS}exec {plan.run} {stdin}"),
                          cpu=req.cpu_demand(), elastic=elastic, timeout=req.run_timeout,
                          kind=f"run_code:{req.language}")
        resp.tangram.steps.append(_grant("run", r))
        resp.run_result = command_result(r)
    if req.fetch_files:
        paths = [_sandbox_path(p) for p in req.fetch_files]
        r = await tg.exec(env, ["sh", "-c", _FETCH, "tangram-fetch", *map(_inside, paths)],
                          cpu=1, timeout=FETCH_TIMEOUT, output_cap=FETCH_CAP,
                          kind="run_code:fetch")
        resp.tangram.steps.append(_grant("fetch", r))
        resp.files = {req.fetch_files[paths.index(p)]: data
                      for p, data in fetched(paths, r.stdout).items()}
    resp.status, resp.message = overall(resp.compile_result, resp.run_result)
    return resp


class RunJupyterResponse(BaseModel):
    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = []
    executor_pod_name: str | None = None
    files: dict[str, str] = {}
    tangram: Grants = Field(default_factory=Grants)


async def run_jupyter(tg: Any, req: RunJupyterRequest) -> RunJupyterResponse:
    """Run the cells in a kernel of their own in a fresh sandbox (see `jupyter`)."""
    for path in [*req.files, *req.fetch_files]:
        try:
            _sandbox_path(path)
        except ValueError as exc:
            raise ValidationError("files" if path in req.files else "fetch_files", path,
                                  str(exc)) from None
        if path.startswith("/") and not absolute_allowed(tg):
            raise ValidationError("files" if path in req.files else "fetch_files", path,
                                  "absolute paths are served only by the isolating backends")
    memory = DEFAULT_MEMORY_MB if req.memory_limit_MB == -1 else req.memory_limit_MB
    pool = warm_pool(tg, DEFAULT_MEMORY_MB)
    env = await (pool.take(memory) if pool is not None else
                 tg.open_env(fresh_trajectory(), memory))
    try:
        files = {_sandbox_path(p): base64.b64decode(c) for p, c in req.files.items()
                 if c is not None and IGNORED_FILE not in p}
        files.update(jupyter.driver_files(req))
        r = await tg.exec(env, staged(files, jupyter.driver_command()), cpu=1,
                          timeout=jupyter.exec_timeout(req), output_cap=jupyter.OUTPUT_CAP,
                          kind="run_jupyter")
        resp = RunJupyterResponse(status=RunStatus.SUCCESS, tangram=Grants(env_id=env))
        resp.tangram.steps.append(_grant("jupyter", r))
        cells, timed_out, stdout = jupyter.parse(r)
        driver = command_result(r)
        driver.stdout = stdout
        if timed_out:
            driver.status, driver.return_code = CommandRunStatus.TIME_LIMIT_EXCEEDED, None
        resp.driver, resp.cells = driver, cells
        if jupyter.no_kernel(r):
            resp.status = RunStatus.SANDBOX_ERROR
            resp.message = f"no Jupyter kernel in the sandbox: {r.stderr.strip()[-300:]}"
        elif driver.status is CommandRunStatus.ERROR:
            resp.status, resp.message = RunStatus.SANDBOX_ERROR, driver.stderr or r.detail
        elif driver.status is not CommandRunStatus.FINISHED or timed_out is None \
                or driver.return_code != 0:
            resp.status = RunStatus.FAILED
        if req.fetch_files:
            paths = [_sandbox_path(p) for p in req.fetch_files]
            f = await tg.exec(env, ["sh", "-c", _FETCH, "tangram-fetch", *map(_inside, paths)],
                              cpu=1, timeout=FETCH_TIMEOUT, output_cap=FETCH_CAP,
                              kind="run_jupyter:fetch")
            resp.files = {req.fetch_files[paths.index(p)]: data
                          for p, data in fetched(paths, f.stdout).items()}
        return resp
    finally:
        await jupyter.shielded_close(tg, env)


# -- the route -----------------------------------------------------------------------------------


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work` while listening for the client going away; if it does, cancel the work (its
    queued actions are dropped, a fresh environment is closed) and return None."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watch.cancel()
    if not task.done() or task.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.info("/run_code: client disconnected; its work was cancelled")
        return None
    return task.result()


router = APIRouter(tags=["sandboxfusion"])


@router.post("/run_jupyter", response_model=RunJupyterResponse)
async def run_jupyter_route(body: RunJupyterRequest, request: Request) -> Response:
    """SandboxFusion's `/run_jupyter`: see `tangram.runtime.sandboxfusion.jupyter`."""
    resp = await cancel_on_disconnect(request, run_jupyter(request.app.state.tangram, body))
    if resp is None:
        return Response(status_code=499)
    return JSONResponse(resp.model_dump(mode="json"))


# SandboxFusion's dataset and judge endpoints, which its SDK calls (`get_prompts`, `submit`,
# ...): the datasets are SandboxFusion's own content, not served here.
UNSERVED = ("/get_prompts", "/get_prompt_by_id", "/submit", "/list_datasets", "/list_ids",
            "/get_metrics", "/get_metrics_function")


def unserved(path: str) -> JSONResponse:
    """A JSON 404 naming what is not served (a client's request for something this server
    does not have, not a server failure)."""
    return JSONResponse(status_code=404, content={
        "error": f"{path} is not served by Tangram", "field": "path", "value": path,
        "problem": "SandboxFusion's dataset and judge endpoints are not implemented; "
                   "/run_code and /run_jupyter are"})


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
        return JSONResponse(status_code=422, content={
            "error": "invalid request body", "field": "body", "value": None, "problem": problem})
    if path == "/run_code":
        return await run_code_route(body, request)
    return await run_jupyter_route(body, request)


@router.post("/run_code", response_model=RunCodeResponse)
async def run_code_route(body: RunCodeRequest, request: Request) -> Response:
    """SandboxFusion's `/run_code`: see `tangram.runtime.sandboxfusion`."""
    # the runtime's refusals (unknown env_id, a demand no pool meets, shutting down) raise
    # `TangramError`s, which the app answers as everywhere else (404, 409, 422, 503)
    resp = await cancel_on_disconnect(request, run_code(request.app.state.tangram, body))
    if resp is None:
        return Response(status_code=499)
    return JSONResponse(resp.model_dump(mode="json"))
