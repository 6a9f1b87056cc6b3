"""SWE-ReX's remote runtime, served per environment under `/swerex/{env_id}/`, so SWE-ReX's own
client works unmodified:

    RemoteRuntime(host=f"{server}/swerex/{env_id}", port=None, auth_token=token)

`X-API-Key` carries the server's token. The endpoints and their bodies are SWE-ReX's
(`is_alive`, `create_session`, `run_in_session`, `close_session`, `execute`, `read_file`,
`write_file`, `upload`, `close`); each command is one of our actions (a session's command
through `Tangram.run`, `execute` through `Tangram.exec`), so the scheduler grants its core.
Errors travel the way SWE-ReX's server sends them: status 511 with the exception's class path
and message, which its client raises again (`CommandTimeoutError`, `NonZeroExitCodeError`,
`SessionExistsError`, `SessionDoesNotExistError`, ...). Differences, documented in
docs/sessions.md: a command that reaches its timeout is interrupted by the server before
`CommandTimeoutError` is raised (the session answers the next command); a syntax error is the
shell's own (exit code 2), not a parse by bashlex; `timeout: null` is the server's longest.
"""

from __future__ import annotations

import ast
import asyncio
import io
import logging
import re
import shlex
import zipfile
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from managers.cpu import files
from tangram.errors import NotFound, TangramError, ValidationError
from tangram.results import Result, Status
from tangram.runtime.http.limits import MAX_TIMEOUT
from tangram.runtime.http.owned import not_pooled

log = logging.getLogger(__name__)
router = APIRouter(prefix="/swerex/{env_id}", tags=["swe-rex"], dependencies=[Depends(not_pooled)])
MATCHED = re.compile(r"matched ('.*'|\".*\")")  # the detail of a run its prompt ended
EXC = "swerex.exceptions."
UPLOAD_MAX = files.MAX_TOTAL  # bytes of one upload's files, unpacked
UPLOAD_FILES = 1 << 16  # files of one upload (a folder sent as a zip)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CreateSession(_Body):
    startup_source: list[str] = []
    session: str = "default"
    session_type: Literal["bash"] = "bash"
    startup_timeout: float = 1.0


class BashAction(_Body):
    command: str = ""
    session: str = "default"
    timeout: float | None = None
    is_interactive_command: bool = False
    is_interactive_quit: bool = False
    check: Literal["silent", "raise", "ignore"] = "raise"
    error_msg: str = ""
    expect: list[str] = []
    action_type: Literal["bash", "bash_interrupt"] = "bash"


class CloseSession(_Body):
    session: str = "default"
    session_type: Literal["bash"] = "bash"


class Command(_Body):
    command: str | list[str]
    timeout: float | None = None
    shell: bool = False
    check: bool = False
    error_msg: str = ""
    env: dict[str, str] | None = None
    cwd: str | None = None
    merge_output_streams: bool = False


class ReadFile(_Body):
    path: str
    encoding: str | None = None
    errors: str | None = None


class WriteFile(_Body):
    content: str
    path: str


class Raised(Exception):
    """An exception for SWE-ReX's client to raise again: its class path and message."""

    def __init__(self, class_path: str, message: str) -> None:
        super().__init__(message)
        self.class_path = class_path


def _transferred(class_path: str, message: str) -> JSONResponse:
    body = {"message": message, "class_path": class_path, "traceback": "", "extra_info": {}}
    return JSONResponse(status_code=511, content={"swerexception": body})


async def _answer(work: Callable[[], Awaitable[dict[str, Any]]]) -> Any:
    """The handler's answer, or the 511 that SWE-ReX's client turns back into its exception."""
    try:
        return await work()
    except Raised as exc:
        return _transferred(exc.class_path, str(exc))
    except NotFound as exc:
        return _transferred("builtins.FileNotFoundError", str(exc))
    except ValidationError as exc:
        return _transferred("builtins.ValueError", str(exc))
    except TangramError as exc:
        return _transferred(EXC + "SwerexException", str(exc))
    except ValueError as exc:  # a value no command can be made of (a lone surrogate, ...)
        return _transferred("builtins.ValueError", f"{type(exc).__name__}: {exc}")


def _existing(tg: Any, env_id: str, session: str) -> None:
    """SWE-ReX's `SessionDoesNotExistError` unless the environment has `session` open."""
    if session not in tg.sessions(env_id):
        raise Raised(EXC + "SessionDoesNotExistError", f"session {session!r} does not exist")


def _timeout(value: float | None) -> float:
    if value is None:
        return MAX_TIMEOUT
    if not 0 < value <= MAX_TIMEOUT:
        raise ValidationError("timeout", value, f"must be in (0, {MAX_TIMEOUT:g}] seconds")
    return float(value)


@router.get("/")
async def root(env_id: str) -> dict[str, str]:
    return {"message": "hello world"}


@router.get("/is_alive")
async def is_alive(env_id: str, request: Request) -> dict[str, Any]:
    tg = request.app.state.tangram
    try:
        tg.sessions(env_id)
    except TangramError as exc:
        return {"is_alive": False, "message": str(exc)}
    return {"is_alive": True, "message": ""}


@router.post("/create_session")
async def create_session(env_id: str, body: CreateSession, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        if body.session in tg.sessions(env_id):
            raise Raised(EXC + "SessionExistsError", f"session {body.session} already exists")
        await tg.open_session(env_id, body.session)
        output = ""
        for source in body.startup_source:
            r = await tg.run(env_id, body.session, f"source {shlex.quote(source)}", timeout=60)
            output += r.stdout
        return {"output": output, "session_type": "bash"}

    return await _answer(work)


@router.post("/run_in_session")
async def run_in_session(env_id: str, body: BashAction, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        _existing(tg, env_id, body.session)
        if body.action_type == "bash_interrupt":  # a timed-out command was interrupted already
            return {"output": "", "exit_code": 0, "failure_reason": "", "expect_string": ""}
        return _observation(body, await _run(tg, env_id, body))

    return await _answer(work)


async def _run(tg: Any, env_id: str, body: BashAction) -> Result:
    interactive = body.is_interactive_command or body.is_interactive_quit
    return await tg.run(
        env_id,
        body.session,
        body.command,
        timeout=_timeout(body.timeout),
        interactive=interactive,
        expect=list(body.expect),
    )


def _observation(body: BashAction, r: Result) -> dict[str, Any]:
    """SWE-ReX's `BashObservation` of a run, or the exception its runtime raises."""
    if r.status is Status.TIMEOUT:
        raise Raised(
            EXC + "CommandTimeoutError",
            f"timeout after {body.timeout} seconds while running command {body.command!r} "
            "(interrupted; the session goes on)",
        )
    if r.status is Status.FAILED:
        raise Raised(EXC + "SessionNotInitializedError", r.detail)
    output = r.stdout
    if body.is_interactive_command or body.is_interactive_quit:
        found = MATCHED.match(r.detail)
        matched = ast.literal_eval(found.group(1)) if found else ""
        output = output.lstrip().removeprefix(body.command).strip()
        return {"output": output, "exit_code": 0, "failure_reason": "", "expect_string": matched}
    code = None if body.check == "ignore" else r.exit_code
    if body.check == "raise" and code != 0:
        msg = (
            f"Command {body.command!r} failed with exit code {code}. "
            f"Here is the output:\n{output!r}"
        )
        raise Raised(EXC + "NonZeroExitCodeError", _with(body.error_msg, msg))
    return {"output": output, "exit_code": code, "failure_reason": "", "expect_string": ""}


def _with(error_msg: str, msg: str) -> str:
    return f"{error_msg}: {msg}" if error_msg else msg


@router.post("/close_session")
async def close_session(env_id: str, body: CloseSession, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        _existing(tg, env_id, body.session)
        await tg.close_session(env_id, body.session)
        return {"session_type": "bash"}

    return await _answer(work)


@router.post("/execute")
async def execute(env_id: str, body: Command, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        r = await tg.exec(env_id, _command_line(body), timeout=_timeout(body.timeout))
        if r.status is Status.TIMEOUT:
            raise Raised(
                EXC + "CommandTimeoutError",
                f"Timeout ({body.timeout}s) exceeded while running command",
            )
        if r.status not in (Status.OK, Status.ERROR):
            raise Raised(EXC + "SwerexException", r.detail)
        if body.check and r.exit_code != 0:
            msg = (
                f"Command {body.command!r} failed with exit code {r.exit_code}. "
                f"Stdout:\n{r.stdout!r}\nStderr:\n{r.stderr!r}"
            )
            raise Raised(EXC + "NonZeroExitCodeError", _with(body.error_msg, msg))
        return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}

    return await _answer(work)


def _command_line(body: Command) -> str:
    """One shell line running the command as `subprocess.run` would: a string under `sh -c`
    with `shell`, else the argv as it is; `env` replaces the environment's variables (PATH
    kept where not given), `cwd` is entered first, stderr merged where asked."""
    if isinstance(body.command, str):
        try:
            line = body.command if body.shell else shlex.join(shlex.split(body.command))
        except ValueError as exc:
            raise ValidationError("command", body.command, f"cannot be split ({exc})") from None
    else:
        line = shlex.join(body.command)
    if body.env is not None:
        for key in body.env:
            if not key.isidentifier():
                raise ValidationError("env", key, "must be a variable name")
        assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in body.env.items())
        line = f'env -i PATH="$PATH" HOME="$HOME" {assigned} sh -c {shlex.quote(line)}'
    if body.cwd is not None:
        line = f"cd {shlex.quote(body.cwd)} && {line}"
    return f"{{ {line}\n}} 2>&1" if body.merge_output_streams else line


@router.post("/read_file")
async def read_file(env_id: str, body: ReadFile, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        got = (await tg.read_files(env_id, [body.path]))[body.path]
        if got is None:
            raise Raised("builtins.FileNotFoundError", f"No such file: {body.path!r}")
        try:
            content = got.decode(body.encoding or "utf-8", body.errors or "strict")
        except (LookupError, UnicodeDecodeError) as exc:
            raise Raised("builtins.UnicodeDecodeError", str(exc)) from None
        return {"content": content}

    return await _answer(work)


@router.post("/write_file")
async def write_file(env_id: str, body: WriteFile, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        await tg.write_files(env_id, {body.path: body.content.encode()})
        return {}

    return await _answer(work)


@router.post("/upload")
async def upload(
    env_id: str,
    request: Request,
    file: UploadFile = File(...),  # noqa: B008 (FastAPI's form parameters)
    target_path: str = Form(...),
    unzip: bool = Form(False),
) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        data = await file.read()
        if not unzip:
            await tg.write_files(env_id, {target_path: data})
            return {}
        unpacked = await asyncio.to_thread(_unzipped, data, target_path)
        await tg.write_files(env_id, unpacked)
        return {}

    return await _answer(work)


def _unzipped(data: bytes, target: str) -> dict[str, bytes]:
    """The files of a zip archive under `target` (a folder's upload); members are paths of
    the environment's as any written file's (`..` and links never leave it), at most
    `UPLOAD_FILES` of them and `UPLOAD_MAX` bytes in all, counted before any is unpacked."""
    out: dict[str, bytes] = {}
    total = 0
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = [i for i in z.infolist() if not i.is_dir()]
            if len(members) > UPLOAD_FILES:
                raise ValidationError(
                    "file", "upload", f"holds {len(members)} files, over {UPLOAD_FILES}"
                )
            for info in members:
                total += info.file_size
                if total > UPLOAD_MAX:
                    raise ValidationError("file", info.filename, f"unpacks past {UPLOAD_MAX} bytes")
                out[f"{target.rstrip('/')}/{info.filename}"] = z.read(info)
    except zipfile.BadZipFile as exc:
        raise ValidationError("file", "upload", f"not a zip archive ({exc})") from None
    return out


@router.post("/close")
async def close(env_id: str, request: Request) -> Any:
    tg = request.app.state.tangram

    async def work() -> dict[str, Any]:
        for name in tg.sessions(env_id):
            await tg.close_session(env_id, name)
        return {}

    return await _answer(work)
