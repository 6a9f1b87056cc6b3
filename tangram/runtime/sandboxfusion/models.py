"""SandboxFusion's request and response models, as its clients send and read them, and the
rules that map Tangram's results onto them (see the package docstring)."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.results import Result, Status
from tangram.runtime.http.limits import (
    MAX_CODE,
    MAX_ITEMS,
    MAX_MEMORY_MB,
    MAX_NAME,
    Choices,
    Seconds,
    Units,
)
from tangram.runtime.sandboxfusion import jupyter
from tangram.runtime.sandboxfusion.jupyter import CellRunResult, RunJupyterRequest
from tangram.runtime.sandboxfusion.paths import check_fetch, check_files
from tangram.runtime.sandboxfusion.runners import missing_toolchain

# an environment's memory when the request says -1 (no per-request limit): the server's default
DEFAULT_MEMORY_MB = int(os.environ.get("TANGRAM_SANDBOXFUSION_MEMORY_MB", "1024"))
ISOLATING_BACKENDS = ("bwrap", "docker")  # a root of its own per sandbox
IGNORED_FILE = "IGNORE_THIS_FILE"  # SandboxFusion skips `files` whose name holds this
FETCH_TIMEOUT = 30.0  # s, the step that reads `fetch_files` back
FETCH_CAP = 8 << 20  # bytes of base64 a fetch step may print
ARG_CHUNK = 64 << 10  # bytes of base64 per argv element (Linux caps one element at 128 KiB)
STDIN_FILE = ".tangram-stdin"
OOM_DETAIL = "killed: out of memory"  # how the CPU backends name a memory kill

# Every language SandboxFusion's request model accepts; anything else is a 422 there and here.
SandboxLanguage = Literal[
    "python",
    "cpp",
    "nodejs",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
]
# -- the request ---------------------------------------------------------------------------------


class CpuRange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min: Units
    max: Units


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

    code: Annotated[str, Field(max_length=MAX_CODE)]
    language: SandboxLanguage
    compile_timeout: Seconds = 10.0
    run_timeout: Seconds = 10.0
    memory_limit_MB: Annotated[int, Field(ge=-1, le=MAX_MEMORY_MB)] = -1
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict, max_length=MAX_ITEMS)
    fetch_files: list[str] = Field(default_factory=list, max_length=MAX_ITEMS)
    args: list[str] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="extra arguments of a pytest run"
    )
    # Tangram's extensions
    cpu: Units | CpuRange | Choices = Field(
        1, description="the run step's CPU demand: cores, {min, max} or a list of amounts"
    )
    elastic: bool | None = Field(
        None,
        description="give a pytest run its granted cores as "
        "workers (default: when `cpu` allows more than one amount)",
    )
    env_id: str | None = Field(
        None,
        max_length=MAX_NAME,
        description="run in this open "
        "environment (multi-turn) instead of a fresh one, which is not "
        "closed",
    )

    @field_validator("code", "stdin")
    @classmethod
    def _unicode(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"must be valid Unicode (a lone surrogate at character {exc.start})"
                ) from None
        return v

    @field_validator("memory_limit_MB")
    @classmethod
    def _memory(cls, v: int) -> int:
        return jupyter.memory_limit(v)

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        return check_files(v)

    @field_validator("fetch_files")
    @classmethod
    def _fetch(cls, v: list[str]) -> list[str]:
        return check_fetch(v)

    def cpu_demand(self) -> Any:
        """The demand as the Python API takes it."""
        return (self.cpu.min, self.cpu.max) if isinstance(self.cpu, CpuRange) else self.cpu

    def is_elastic(self) -> bool:
        if self.elastic is not None:
            return self.elastic
        flexible = isinstance(self.cpu, CpuRange | list) and self.cpu_demand() not in ([1], (1, 1))
        return self.language == "pytest" and flexible


FIELDS = (
    set(RunCodeRequest.model_fields)
    | set(CpuRange.model_fields)
    | set(RunJupyterRequest.model_fields)
)

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
        return CommandRunResult(
            status=CommandRunStatus.TIME_LIMIT_EXCEEDED,
            execution_time=r.run_s,
            stdout=r.stdout,
            stderr=r.stderr,
        )
    missing = missing_toolchain(r.exit_code, r.stderr)
    if missing is not None:
        return CommandRunResult(
            status=CommandRunStatus.ERROR, execution_time=r.run_s, stdout=r.stdout, stderr=missing
        )
    if r.status in (Status.OK, Status.ERROR) and r.exit_code is not None:
        stderr = r.stderr
        if r.detail.startswith(OOM_DETAIL):
            stderr = (
                f"{stderr}{'' if not stderr or stderr.endswith(chr(10)) else chr(10)}"
                f"tangram: {r.detail}\n"
            )
        return CommandRunResult(
            status=CommandRunStatus.FINISHED,
            execution_time=r.run_s,
            return_code=r.exit_code,
            stdout=r.stdout,
            stderr=stderr,
        )
    return CommandRunResult(
        status=CommandRunStatus.ERROR,
        execution_time=r.run_s,
        stdout=r.stdout,
        stderr=r.stderr or f"{r.status}: {r.detail}",
    )


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


class RunJupyterResponse(BaseModel):
    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = []
    executor_pod_name: str | None = None
    files: dict[str, str] = {}
    tangram: Grants = Field(default_factory=Grants)
