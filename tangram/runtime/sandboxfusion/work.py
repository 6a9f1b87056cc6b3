"""The work of one request: its steps as Tangram actions in one environment.

Inputs (`files`, the code, `stdin`) go in through the environments' files API (`write_files`:
openat2 confined to the work directory, no process per file) where the CPU manager is local and
the path is the work directory's (relative, or under /sandbox in a bwrap sandbox); the others
(absolute paths elsewhere in the sandbox's own root, a remote node) travel inside the first
step's argv as base64 and are written by the step itself, so a request works on every CPU
backend. `fetch_files` come back the same two ways (`read_files`, or a fetch step).
"""

from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

from tangram.errors import TangramError, ValidationError
from tangram.results import Result, placement_json
from tangram.runtime.sandboxfusion import jupyter, jupyter_sessions
from tangram.runtime.sandboxfusion.jupyter import RunJupyterRequest
from tangram.runtime.sandboxfusion.models import (
    ARG_CHUNK,
    DEFAULT_MEMORY_MB,
    FETCH_CAP,
    FETCH_TIMEOUT,
    IGNORED_FILE,
    ISOLATING_BACKENDS,
    STDIN_FILE,
    CommandRunStatus,
    Grants,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterResponse,
    RunStatus,
    StepGrant,
    _inside,
    absolute_allowed,
    command_result,
    overall,
)
from tangram.runtime.sandboxfusion.paths import sandbox_path as _sandbox_path
from tangram.runtime.sandboxfusion.runners import Plan, plain_argv, plan_for
from tangram.runtime.sandboxfusion.warm import POOLED, fresh_trajectory, pooled, warm_pool

WORK = "/sandbox"  # a bwrap sandbox's work directory, as its commands name it

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
_NO_STDIN = "< /dev/null"

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
            argv += [_inside(path), text[i : i + ARG_CHUNK]]
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


def _grant(tg: Any, step: str, r: Result) -> StepGrant:
    """One step's grant, under the CPU resource name the cluster configured."""
    cpu = tg.cpu.resource
    placement = r.placement.get(cpu)
    return StepGrant(
        step=step,
        action_id=r.action_id,
        cores=int(r.units.get(cpu, 0)),
        placement={} if placement is None else placement_json(placement),
        queued_s=r.queued_s,
        run_s=r.run_s,
    )


def no_gpu(tg: Any, language: str) -> str | None:
    """Why `tg` cannot grant `language`'s run a GPU (no GPU pool, a simulated one, a CPU
    backend that gives commands no GPU), None where it can."""
    gpu = getattr(tg, "gpu", None)
    if gpu is None:
        return f"{language} needs a GPU: this server has no GPU pool"
    if gpu.simulated:
        return f"{language} needs a GPU: this server's GPU pool is simulated (no GPU here)"
    refused = tg.cpu.gpus_refused() if tg.cpu is not None else None
    return None if refused is None else f"{language} needs a GPU: {refused}"


async def run_code(tg: Any, req: RunCodeRequest) -> RunCodeResponse:
    """Run one request on `tg` (a `Tangram`): see the package docstring. A fresh environment
    is closed before this returns, also when it is cancelled."""
    plan = plan_for(req.language, req.code, list(req.files), req.args)
    if isinstance(plan, str):
        return RunCodeResponse(status=RunStatus.SANDBOX_ERROR, message=plan)
    if plan.gpus is not None and (why := no_gpu(tg, req.language)) is not None:
        return RunCodeResponse(status=RunStatus.SANDBOX_ERROR, message=why)
    paths = [*req.files, *req.fetch_files]
    if any(p.startswith("/") for p in paths) and not absolute_allowed(tg):
        bad = next(p for p in paths if p.startswith("/"))
        raise ValidationError(
            "files" if bad in req.files else "fetch_files",
            bad,
            "absolute paths are served only by the isolating backends "
            f"({', '.join(ISOLATING_BACKENDS)}), where they are the "
            "sandbox's own; give a path relative to the work directory",
        )
    memory = DEFAULT_MEMORY_MB if req.memory_limit_MB == -1 else req.memory_limit_MB
    if req.env_id is not None:
        if pooled(tg, req.env_id):
            raise ValidationError("env_id", req.env_id, POOLED)
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
    files.update(
        {
            _sandbox_path(p): base64.b64decode(c)
            for p, c in req.files.items()
            if c is not None and IGNORED_FILE not in p
        }
    )
    if plan.source is not None:
        files[plan.source] = (plan.code_prefix + req.code).encode()
    if req.stdin is not None:
        files[STDIN_FILE] = req.stdin.encode()
    return files


def direct(tg: Any, path: str) -> bool:
    """Whether `path` (normalised) goes through the files API: a local CPU manager, and the
    work directory's own (relative, or under /sandbox in a bwrap sandbox)."""
    cpu = getattr(tg, "cpu", None)
    backend = getattr(cpu, "backend", None)
    if not getattr(backend, "local", False) or not hasattr(cpu, "write_files"):
        return False
    if not path.startswith("/"):
        return True
    return getattr(backend, "name", "") == "bwrap" and path.startswith(WORK + "/")


async def _put(tg: Any, env: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """Write what the files API can; returns the rest (for the first step to write)."""
    mine = {p: data for p, data in files.items() if direct(tg, p)}
    if mine:
        await tg.write_files(env, mine)
    return {p: data for p, data in files.items() if p not in mine}


async def _fetch(
    tg: Any, env: str, req: RunCodeRequest | RunJupyterRequest, kind: str
) -> dict[str, str]:
    """`fetch_files` as {requested path: base64}; missing ones and non-files left out."""
    paths = [_sandbox_path(p) for p in req.fetch_files]
    out: dict[str, str] = {}
    got: dict[str, bytes | None] = {}
    mine = [p for p in paths if direct(tg, p)]
    if mine:
        try:
            got = await tg.read_files(env, mine)
        except (TangramError, OSError):  # too large for the files API: the step reads them
            got = {}
        out.update(
            {p: base64.b64encode(data).decode() for p, data in got.items() if data is not None}
        )
    rest = [p for p in paths if p not in mine or p not in got]
    if rest:
        r = await tg.exec(
            env,
            ["sh", "-c", _FETCH, "tangram-fetch", *map(_inside, rest)],
            cpu=1,
            timeout=FETCH_TIMEOUT,
            output_cap=FETCH_CAP,
            kind=kind,
        )
        out.update(fetched(rest, r.stdout))
    return {req.fetch_files[paths.index(p)]: data for p, data in out.items()}


def _argv(
    tg: Any,
    env: str,
    plan: Plan,
    step: tuple[str, str],
    files: dict[str, bytes],
    guard: str,
    stdin: str,
) -> list[str]:
    """A step's argv, `step` its (shell prefix, command): the command started directly where
    nothing is to be staged, stdin is none and the spawner guards it (`plain_argv`; a step
    granted GPUs starts in a device sandbox, not through the spawner), else by the staging
    shell."""
    prefix, command = step
    if not files and stdin == _NO_STDIN and plan.gpus is None and _spawned(tg, env):
        plain = plain_argv(command, plan.tools if guard else (), plan.jars if guard else ())
        if plain is not None:
            return plain
    return staged(files, f"{guard}{prefix}{command} {stdin}")


def _spawned(tg: Any, env: str) -> bool:
    """Whether the environment's commands start through a spawner that names a missing
    program (`Sandbox.spawned`; a local CPU manager)."""
    find = getattr(getattr(tg, "cpu", None), "sandbox", None)
    sandbox = find(env) if find is not None else None
    return sandbox is not None and sandbox.spawned


async def _steps(tg: Any, env: str, plan: Plan, req: RunCodeRequest) -> RunCodeResponse:
    files = await _put(tg, env, _inputs(plan, req))
    stdin = f"< {STDIN_FILE}" if req.stdin is not None else _NO_STDIN
    guard = plan.guard()
    resp = RunCodeResponse(status=RunStatus.SUCCESS, tangram=Grants(env_id=env))
    if plan.compile is not None:
        r = await tg.exec(
            env,
            _argv(tg, env, plan, ("", plan.compile), files, guard, _NO_STDIN),
            cpu=1,
            timeout=req.compile_timeout,
            kind=f"run_code:{req.language}:compile",
        )
        resp.tangram.steps.append(_grant(tg, "compile", r))
        resp.compile_result = command_result(r)
        files, guard = {}, ""
    compiled = resp.compile_result is None or (
        resp.compile_result.status is CommandRunStatus.FINISHED
        and resp.compile_result.return_code == 0
    )
    if compiled:
        elastic = req.language == "pytest" and req.is_elastic()
        r = await tg.exec(
            env,
            _argv(tg, env, plan, (f"{_WORKERS}exec ", plan.run), files, guard, stdin),
            cpu=req.cpu_demand(),
            elastic=elastic,
            timeout=req.run_timeout,
            kind=f"run_code:{req.language}",
            **({} if plan.gpus is None else {"gpus": plan.gpus}),
        )
        resp.tangram.steps.append(_grant(tg, "run", r))
        resp.run_result = command_result(r)
    if req.fetch_files:
        resp.files = await _fetch(tg, env, req, "run_code:fetch")
    resp.status, resp.message = overall(resp.compile_result, resp.run_result)
    return resp


async def run_jupyter(tg: Any, req: RunJupyterRequest) -> RunJupyterResponse:
    """Run the cells in a kernel of their own in a fresh sandbox (see `jupyter`)."""
    for path in [*req.files, *req.fetch_files]:
        try:
            _sandbox_path(path)
        except ValueError as exc:
            raise ValidationError(
                "files" if path in req.files else "fetch_files", path, str(exc)
            ) from None
        if path.startswith("/") and not absolute_allowed(tg):
            raise ValidationError(
                "files" if path in req.files else "fetch_files",
                path,
                "absolute paths are served only by the isolating backends",
            )
    memory = DEFAULT_MEMORY_MB if req.memory_limit_MB == -1 else req.memory_limit_MB
    if req.session is not None:  # our extension: a kernel kept across requests
        files = {
            _sandbox_path(p): base64.b64decode(c)
            for p, c in req.files.items()
            if c is not None and IGNORED_FILE not in p
        }
        resp, env = await jupyter_sessions.run_in_session(tg, req, memory, files)
        if req.fetch_files:
            resp.files = await _fetch(tg, env, req, "run_jupyter:fetch")
        return resp
    pool = warm_pool(tg, DEFAULT_MEMORY_MB)
    env = await (pool.take(memory) if pool is not None else tg.open_env(fresh_trajectory(), memory))
    try:
        files = {
            _sandbox_path(p): base64.b64decode(c)
            for p, c in req.files.items()
            if c is not None and IGNORED_FILE not in p
        }
        files.update(jupyter.driver_files(req))
        files = await _put(tg, env, files)
        r = await tg.exec(
            env,
            staged(files, jupyter.driver_command()),
            cpu=1,
            timeout=jupyter.exec_timeout(req),
            output_cap=jupyter.OUTPUT_CAP,
            kind="run_jupyter",
        )
        resp = _jupyter_response(tg, r, env)
        if req.fetch_files:
            resp.files = await _fetch(tg, env, req, "run_jupyter:fetch")
        return resp
    finally:
        await jupyter.shielded_close(tg, env)
        if pool is not None:
            pool.discard(env)


def _jupyter_response(tg: Any, r: Result, env: str) -> RunJupyterResponse:
    resp = RunJupyterResponse(status=RunStatus.SUCCESS, tangram=Grants(env_id=env))
    resp.tangram.steps.append(_grant(tg, "jupyter", r))
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
    elif (
        driver.status is not CommandRunStatus.FINISHED
        or timed_out is None
        or driver.return_code != 0
    ):
        resp.status = RunStatus.FAILED
    return resp
