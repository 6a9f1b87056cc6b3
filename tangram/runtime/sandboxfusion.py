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

Not supported: `executor_pod_name` is always null; the whole body is limited to the server's
MAX_BODY; `memory_limit_MB` is the environment's memory (enforced where the backend enforces
memory, e.g. cgroup and Docker; -1 means the server's default).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import posixpath
import re
import shlex
import shutil
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.results import Result, Status

log = logging.getLogger("tangram.runtime.sandboxfusion")

T = TypeVar("T")

DEFAULT_MEMORY_MB = 1024  # an environment's memory when the request says -1 (no limit)
FETCH_TIMEOUT = 30.0  # s, the step that reads `fetch_files` back
FETCH_CAP = 8 << 20  # bytes of base64 a fetch step may print
ARG_CHUNK = 64 << 10  # bytes of base64 per argv element (Linux caps one element at 128 KiB)
STDIN_FILE = ".tangram-stdin"
MAX_TIMEOUT = 24 * 3600.0

# Every language SandboxFusion's request model accepts; anything else is a 422 there and here.
SandboxLanguage = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
    "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket"]


@dataclass(frozen=True, slots=True)
class Runner:
    """How one language runs: the code is written to `source`; `compile` (a shell command, or
    None) then `run` run in the environment's work directory; `tool` must be on PATH."""

    source: str
    run: str
    tool: str
    compile: str | None = None


RUNNERS: dict[str, Runner] = {
    "python": Runner("main.py", "python3 main.py", "python3"),
    "pytest": Runner("test_main.py", "python3 -m pytest -q $workers test_main.py", "python3"),
    "bash": Runner("main.sh", "bash main.sh", "bash"),
    "cpp": Runner("main.cpp", "./main", "g++", "g++ -std=c++17 -O2 -o main main.cpp -lpthread"),
    "go": Runner("main.go", "./main", "go", "go build -o main main.go"),
    "rust": Runner("main.rs", "./main", "rustc", "rustc -O -o main main.rs"),
    "nodejs": Runner("main.js", "node main.js", "node"),
    "ruby": Runner("main.rb", "ruby main.rb", "ruby"),
    "perl": Runner("main.pl", "perl main.pl", "perl"),
    "php": Runner("main.php", "php main.php", "php"),
    "lua": Runner("main.lua", "lua main.lua", "lua"),
    "R": Runner("main.R", "Rscript main.R", "Rscript"),
    "julia": Runner("main.jl", "julia main.jl", "julia"),
}


def runner_for(language: str) -> Runner | str:
    """The language's runner, or why this server cannot run it."""
    runner = RUNNERS.get(language)
    if runner is None:
        return f"language {language!r} is not supported by this server (supported: " \
               f"{', '.join(sorted(RUNNERS))})"
    if shutil.which(runner.tool) is None:
        return f"language {language!r} needs {runner.tool!r}, which this server does not have"
    return runner


# -- the request ---------------------------------------------------------------------------------

Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)]
Units = Annotated[int, Field(ge=1, le=1 << 20)]


class CpuRange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min: Units
    max: Units


def _sandbox_path(path: str) -> str:
    """A path inside the sandbox's work directory, normalised; ValueError when it escapes it
    (absolute, `..`) or cannot be a file name."""
    if not path or "\x00" in path or "\\" in path:
        raise ValueError(f"{path!r} is not a file path")
    if path.startswith("/"):
        raise ValueError(f"{path!r}: absolute paths are outside the sandbox (give a relative "
                         "one)")
    norm = posixpath.normpath(path)
    if norm in (".", "") or norm == ".." or norm.startswith("../"):
        raise ValueError(f"{path!r} escapes the sandbox's work directory")
    return norm


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
        if v == 0:
            raise ValueError("must be -1 (no limit) or a positive number of MiB")
        return v

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


FIELDS = set(RunCodeRequest.model_fields) | set(CpuRange.model_fields)


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
    """A Tangram result as a SandboxFusion step: a timeout has no return code (as there)."""
    if r.status is Status.TIMEOUT:
        return CommandRunResult(status=CommandRunStatus.TIME_LIMIT_EXCEEDED,
                                execution_time=r.run_s, stdout=r.stdout, stderr=r.stderr)
    if r.status in (Status.OK, Status.ERROR) and r.exit_code is not None:
        return CommandRunResult(status=CommandRunStatus.FINISHED, execution_time=r.run_s,
                                return_code=r.exit_code, stdout=r.stdout, stderr=r.stderr)
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
# file), then execs the rest of its arguments.
_STAGE = r"""set -e
prev=
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  mkdir -p "$(dirname -- "$1")"
  if [ "$1" != "$prev" ]; then : > "$1"; fi
  printf %s "$2" | base64 -d >> "$1"
  prev=$1
  shift 2
done
shift
exec "$@"
"""

# An elastic pytest run gets its granted cores (`nproc` counts the cores it may run on) as
# pytest-xdist workers, only where xdist imports and more than one core was granted: `-n` makes
# a pytest without xdist fail outright.
_WORKERS = 'n=$(nproc); workers=; if [ "$n" -gt 1 ] && python3 -c "import xdist" 2>/dev/null; ' \
           'then workers="-n $n"; fi; '

# Prints "<index> <base64>" for each argument that is a regular file; missing ones are left out.
_FETCH = r"""i=0
for f; do
  if [ -f "$f" ]; then printf '%s ' "$i"; base64 -w 0 -- "$f"; echo; fi
  i=$((i + 1))
done
"""


def staged(files: dict[str, bytes], command: str) -> list[str]:
    """An argv that writes `files` (relative paths) then runs the shell `command`."""
    argv = ["sh", "-c", _STAGE, "tangram-stage"]
    for path, data in files.items():
        text = base64.b64encode(data).decode()
        for i in range(0, max(len(text), 1), ARG_CHUNK):
            argv += ["./" + path, text[i:i + ARG_CHUNK]]
    return [*argv, "--", "sh", "-c", command]


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
    runner = runner_for(req.language)
    if isinstance(runner, str):
        return RunCodeResponse(status=RunStatus.SANDBOX_ERROR, message=runner)
    memory = DEFAULT_MEMORY_MB if req.memory_limit_MB == -1 else req.memory_limit_MB
    own = req.env_id is None
    env = req.env_id or await tg.open_env(f"sandboxfusion-{uuid.uuid4().hex[:12]}", memory)
    try:
        return await _steps(tg, env, runner, req)
    finally:
        if own:
            await asyncio.shield(tg.close_env(env))


async def _steps(tg: Any, env: str, runner: Runner, req: RunCodeRequest) -> RunCodeResponse:
    files = {_sandbox_path(p): base64.b64decode(c) for p, c in req.files.items() if c is not None}
    files[runner.source] = req.code.encode()
    stdin = "< /dev/null"
    if req.stdin is not None:
        files[STDIN_FILE] = req.stdin.encode()
        stdin = f"< {STDIN_FILE}"
    resp = RunCodeResponse(status=RunStatus.SUCCESS, tangram=Grants(env_id=env))
    if runner.compile is not None:
        r = await tg.exec(env, staged(files, f"{runner.compile} < /dev/null"), cpu=1,
                          timeout=req.compile_timeout, kind=f"run_code:{req.language}:compile")
        resp.tangram.steps.append(_grant("compile", r))
        resp.compile_result = command_result(r)
        files = {}
    compiled = resp.compile_result is None or (
        resp.compile_result.status is CommandRunStatus.FINISHED
        and resp.compile_result.return_code == 0)
    if compiled:
        extra = " " + shlex.join(req.args) if req.args and req.language == "pytest" else ""
        workers = _WORKERS if req.is_elastic() else "workers=; "
        r = await tg.exec(env, staged(files, f"{workers}exec {runner.run}{extra} {stdin}"),
                          cpu=req.cpu_demand(), elastic=req.is_elastic(),
                          timeout=req.run_timeout, kind=f"run_code:{req.language}")
        resp.tangram.steps.append(_grant("run", r))
        resp.run_result = command_result(r)
    if req.fetch_files:
        paths = [_sandbox_path(p) for p in req.fetch_files]
        r = await tg.exec(env, ["sh", "-c", _FETCH, "tangram-fetch", *("./" + p for p in paths)],
                          cpu=1, timeout=FETCH_TIMEOUT, output_cap=FETCH_CAP,
                          kind="run_code:fetch")
        resp.tangram.steps.append(_grant("fetch", r))
        resp.files = {req.fetch_files[paths.index(p)]: data
                      for p, data in fetched(paths, r.stdout).items()}
    resp.status, resp.message = overall(resp.compile_result, resp.run_result)
    return resp


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


@router.post("/run_code", response_model=RunCodeResponse)
async def run_code_route(body: RunCodeRequest, request: Request) -> Response:
    """SandboxFusion's `/run_code`: see `tangram.runtime.sandboxfusion`."""
    # the runtime's refusals (unknown env_id, a demand no pool meets, shutting down) raise
    # `TangramError`s, which the app answers as everywhere else (404, 409, 422, 503)
    resp = await cancel_on_disconnect(request, run_code(request.app.state.tangram, body))
    if resp is None:
        return Response(status_code=499)
    return JSONResponse(resp.model_dump(mode="json"))
