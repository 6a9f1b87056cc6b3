"""The executor backend behind the CPU manager: how an environment exists and how one exec runs.

A backend does the side effects only; the manager owns the pool logic and each environment's
record. `Backend.open` returns the environment's `Sandbox`, the one object that holds what the
backend keeps for it and runs its commands. Contract of `Sandbox.exec(ExecSpec)`: the
command runs confined to exactly `spec.cores` (cpuset and, where the backend can, a CPU quota of
len(cores) cores); when it returns, no process of that exec is left running (leftovers are
killed, so the cores really come back); the action's own failures come back as an `Result`.
A lost environment raises `EnvironmentBroken`.

Life: constructing a backend only checks its options (it starts no process and creates no
cgroup or file: `test_backend_rules`); `start()` probes (a trial sandbox, an engine ping) and
prepares (the support folder), raising `BackendUnavailable` with the fix; `open` before it
raises `NotStarted` (and without a sandbox no command runs). The rules every backend shares
live here, in the template methods (`Backend.open`, `Sandbox.exec`, `Sandbox.close`,
`Sandbox.serving`) and helpers, which no backend overrides, so none words them its own way:

- an exec in an environment that is not open fails `EnvironmentBroken`; one whose
  environment was closed while it ran comes back `cancelled`, saying so;
- which limit a command hit (`name_limits`, the one OOM rule): a command the kernel's
  OOM killer killed (SIGKILL, with the environment's OOM count up) is `error` with detail
  `killed: out of memory (limit N MiB)`; one that reached its deadline stays `timeout`, its
  detail adding that a process of it was killed for memory; a fork the pids limit refused is
  named in the detail, the status unchanged; so is either limit where the command exited 0 all
  the same (a shell that went on);
- GPUs (a vector exec's chunk, host indices): the command sees `grant.GPU_VARIABLES`; how far
  a backend enforces the grant is its `gpu_mode` (`GPU_MODES`), and a backend that
  cannot give GPUs at all (`gpus_refused`) fails such an exec naming `gpus`;
- the work folder (mode 0700, handed to the environment's uid where it has one) and the
  support folder (the pytest plugin of elastic runs: see `grant`), removed at `shutdown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from managers.cpu.environments import Environment
from managers.cpu.grant import command_env, install_plugin
from managers.cpu.leftovers import owned_name, sweep_workdirs
from managers.cpu.mounts import remove_folder
from managers.cpu.removal import remove_tree_async
from managers.cpu.request import ExecSpec
from managers.cpu.sessions.shell import ShellSession
from tangram.errors import ActionFailed, BackendUnavailable, TangramError, ValidationError
from tangram.results import Result, Status

DEFAULT_PIDS_MAX = 512  # processes (and threads) per environment
# how a backend gives an exec its granted GPUs (`Backend.gpu_mode`)
GPU_MODES = {
    "devices": "only the granted GPUs' device nodes are in the sandbox, and the variables",
    "variables": "the variables only: every GPU of the machine stays reachable (no isolation)",
    "recorded": "nothing runs: the grant is recorded",
}
SIGKILLED = (-9, 137, 128 + 9)  # killed by SIGKILL: the process itself, or a shell's child


class EnvironmentBroken(ActionFailed):
    """The environment's sandbox is gone (its container died, its cgroup was removed)."""


class NotStarted(TangramError):
    """A backend (or the manager holding it) used before its `start()`."""


@dataclass(frozen=True, slots=True)
class LimitCounts:
    """An environment's limit counters so far; compared before and after an exec."""

    ooms: int = 0  # processes the kernel killed for memory
    refused: int = 0  # forks the pids limit refused


def name_limits(
    outcome: Result, before: LimitCounts, after: LimitCounts, memory_mb: int, pids_max: int | None
) -> Result:
    """The one rule saying which limit a command hit (see the module docstring): a command
    that succeeded all the same (a shell that went on after a refused fork, a child killed for
    memory) says so too, its status unchanged."""
    if outcome.status not in (Status.OK, Status.ERROR, Status.TIMEOUT):
        return outcome
    detail = outcome.detail
    if after.ooms > before.ooms:
        if outcome.status is not Status.ERROR:  # timed out, or exit 0 all the same
            detail += f"; the kernel killed a process of it for memory (limit {memory_mb} MiB)"
        elif outcome.exit_code in SIGKILLED:
            detail = f"killed: out of memory (limit {memory_mb} MiB)"
        else:
            detail += f"; the kernel killed a process of it for memory (limit {memory_mb} MiB)"
    if after.refused > before.refused:
        detail += f"; the environment's process limit ({pids_max} pids) refused to start a process"
    return dataclasses.replace(outcome, detail=detail)


def check_pids_max(value: object) -> int:
    """`pids_max` as every backend takes it: processes per environment."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(
            "cpu.pids_max", value, "must be a positive integer (processes per environment)"
        )
    return value


class Backend(ABC):
    """A family member implements `probe`, `_open`, `_exec` and `_close` (and `_start`,
    `_sweep`, `_limit_counts`, `_shutdown` where it has something to do); the public methods
    are the shared rules around them."""

    name: str = "backend"
    local: bool = True  # runs on this machine only (one node)
    roots: bool = False  # gives an environment its own root filesystem (`Environment.root`)
    engine_images: bool = False  # takes `Environment.image` from its own engine (docker)
    support_files: bool = True  # has a support folder (the pytest plugin) its commands read
    inside_work: str | None = None  # the work folder as commands see it (None: its host path)
    inside_support: str | None = None  # the support folder as commands see it
    pids_max: int | None = None  # processes per environment, where the backend limits them
    gpu_mode: str = "variables"  # how an exec gets its granted GPUs: a key of `GPU_MODES`
    gpus_refused: str | None = None  # why this backend gives a command no GPU, where it cannot
    isolates: bool = False  # a command cannot see or reach the host or another environment
    # what this backend does not guarantee here that the root bwrap backend does (None: no
    # loss worth saying); in /v1/status as `cpu_lost`
    guarantees_lost: str | None = None

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:10]
        self.support = Path(tempfile.gettempdir()) / owned_name(f"{self.tag}-lib")
        self._started = False
        self._drop_support: Callable[[], object] | None = None

    @classmethod
    @abstractmethod
    def probe(cls) -> str | None:
        """None when this backend can run here, else why not and how to fix it."""

    # -- life ----------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._started

    async def start(self) -> None:
        """Probe and prepare (off the event loop); raises `BackendUnavailable` naming the fix.
        Idempotent; `shutdown` undoes it."""
        if not self._started:
            await asyncio.to_thread(self._start)
            self._started = True

    def _start(self) -> None:
        """Blocking part of `start`: by default probe, then install the support folder."""
        why = self.probe()
        if why is not None:
            raise BackendUnavailable(why)
        self._install_support()

    def _install_support(self) -> None:
        if self.support_files and self._drop_support is None:
            install_plugin(self.support)
            # a backend never shut down still leaves no folder when the interpreter exits
            # (and unmounts what it holds: `bwrap.views`)
            self._drop_support = weakref.finalize(self, remove_folder, str(self.support))

    def _require_started(self, what: str) -> None:
        if not self._started:
            raise NotStarted(
                f"the {self.name} backend cannot {what} before it is started: "
                f"await its start() (CpuManager.start does) first"
            )

    def sweep(self) -> list[str]:
        """Kill and remove what servers that died left behind (their PIDs are gone): called
        once, after `start`, before serving; returns a line per thing swept, for the log."""
        self._require_started("sweep")
        return self._sweep() + (self._sweep_workdirs() if self.support_files else [])

    def _sweep(self) -> list[str]:
        return []

    def _sweep_workdirs(self) -> list[str]:
        """Dead servers' work folders under this backend's support folder's parent."""
        return sweep_workdirs(self.support.parent)

    async def shutdown(self) -> None:
        """Release what the backend holds beyond environments (clients, parent cgroups) and
        its support folder. Nothing to do before `start`."""
        if not self._started:
            return
        try:
            await self._shutdown()
        finally:
            if self._drop_support is not None:
                await asyncio.to_thread(self._drop_support)
                self._drop_support = None
            self._started = False

    async def _shutdown(self) -> None:
        """What the backend itself releases at `shutdown`."""

    # -- environments --------------------------------------------------------------------------
    async def open(self, env: Environment, cores: tuple[int, ...]) -> Sandbox:
        """Create the sandbox of `env` (all of `cores` allowed while idle) and return it: the
        one object that runs, suspends, resets and closes it."""
        self._require_started("open an environment")
        return await self._open(env, cores)

    @abstractmethod
    async def _open(self, env: Environment, cores: tuple[int, ...]) -> Sandbox:
        """Create the sandbox of `env` (its backend's `Sandbox`)."""

    # -- helpers the family shares -------------------------------------------------------------
    def inside_python(self, env: Environment) -> str | None:
        """The server's own Python as the commands of `env` run it (`TANGRAM_PYTHON`), None
        where it is not there. Here: the server's `sys.executable` (the commands run on the
        host)."""
        return sys.executable

    @staticmethod
    def _make_workdir(env: Environment, uid: int | None = None) -> None:
        """The environment's work folder, mode 0700, handed to `uid` (its files are that
        user's) where the environment has a uid of its own; raises `BackendUnavailable`."""
        try:
            os.makedirs(env.workdir, mode=0o700, exist_ok=True)
            if uid is not None:
                os.chown(env.workdir, uid, uid)
            os.chmod(env.workdir, 0o700)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot hand the work directory {env.workdir} of "
                f"environment {env.id} to uid {uid} ({exc})"
            ) from exc

    @staticmethod
    async def _remove_workdir(env: Environment) -> list[str]:
        """Remove the work folder (in a thread: a hostile tree takes long); what is left."""
        return await remove_tree_async(env.workdir)

    def new_owner(self) -> int | None:
        """A uid for an environment about to open (`Environment.uid`: its commands run as it),
        None where this backend runs commands as the server's own user."""
        return None

    def describe(self) -> str:
        return self.name


class Sandbox(ABC):
    """One environment's sandbox in its backend (`Backend.open` makes it): what the backend
    holds for that environment alone (its cgroups, its namespaces' holder, its uid, its
    container) lives here, on the object, and nowhere keyed by the environment's id. The
    public methods are the rules every backend shares (the module docstring); a backend's
    sandbox implements `_run` and `_close` (and `_limit_counts`, `_serve_launch`, `reset`,
    `suspend`, `resume` where it has something to do)."""

    uid: int | None = None  # the host uid its commands run as (None: the server's own)

    def __init__(self, backend: Backend, env: Environment) -> None:
        self.backend = backend
        self.env = env
        self.open = True  # False once `close` began: a command still running is cancelled

    @property
    def launch_cwd(self) -> str:
        """The folder the server starts the environment's processes in (its work folder;
        one the server's user may enter, where that folder is not)."""
        return self.env.workdir

    def owner_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` with the authority the server holds over the environment's files
        (its own, where it may reach them: a rootless sandbox's are another uid's)."""
        return fn(*args)

    # -- the shared rules ----------------------------------------------------------------------
    async def exec(self, spec: ExecSpec) -> Result:
        """Run one command confined to `spec.cores`, with the environment of
        `grant.command_env` (never the server's own). See the module docstring for the rules
        around it."""
        b, env = self.backend, self.env
        b._require_started("run a command")
        if spec.gpus and b.gpus_refused is not None:
            return Result(Status.FAILED, detail=f"gpus: {b.gpus_refused}")
        if not self.open:
            raise EnvironmentBroken(
                f"environment {env.id} is broken: it is not open in the {b.name} backend"
            )
        before = self._limit_counts()
        try:
            outcome = await self._run(spec)
        except EnvironmentBroken:
            if self.open:
                raise
            outcome = Result(Status.CANCELLED)
        if not self.open:
            return dataclasses.replace(
                outcome,
                status=Status.CANCELLED,
                detail=f"killed: environment {env.id} was closed while the command ran",
            )
        if outcome.status not in (Status.OK, Status.ERROR, Status.TIMEOUT):
            return outcome  # it did not run to its end: no limit to name
        return name_limits(outcome, before, self._limit_counts(), env.memory_mb, b.pids_max)

    async def close(self) -> None:
        """Kill everything left in the sandbox and remove it. Idempotent; a command still
        running in it comes back `cancelled`."""
        if not self.open:
            return
        self.open = False
        if self.backend.started:
            await self._close()

    @contextlib.asynccontextmanager
    async def serving(
        self, argv: Sequence[str], stdin: int, cap: int
    ) -> AsyncIterator[asyncio.subprocess.Process]:
        """A process of the server's own work on the environment (the files API's tar),
        started where and as its commands are (its cgroup, its sandbox, its uid, its seccomp
        filter, each as far as this backend confines commands), with `stdin` as descriptor 0
        and stdout and stderr piped (at most `cap` + 1 bytes of stdout pass a sandbox's
        output relay). On exit it and everything it started are killed."""
        self.backend._require_started("serve files")
        if not self.open:
            raise EnvironmentBroken(
                f"environment {self.env.id} is broken: it is not open in the "
                f"{self.backend.name} backend"
            )
        argv, fds, done = await self._serve_launch(list(argv), cap)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=stdin,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=fds,
                start_new_session=True,
                cwd=self.launch_cwd,
                env=self.environ(SERVING),  # (one core: see `_serve_launch`)
            )
        except BaseException:
            done()
            raise
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            done()

    def environ(self, spec: ExecSpec) -> dict[str, str]:
        """The whole environment of one command: `grant.command_env` with the folders as the
        command sees them."""
        b = self.backend
        return command_env(
            self.env.id,
            len(spec.cores),
            b.inside_work or self.env.workdir,
            elastic=spec.elastic,
            plugin_dir=b.inside_support or str(b.support),
            gpus=spec.gpus,
            gpus_isolated=b.gpu_mode == "devices",
            python=b.inside_python(self.env),
        )

    # -- what a backend's sandbox implements ---------------------------------------------------
    @abstractmethod
    async def _run(self, spec: ExecSpec) -> Result:
        """Run one command in the open sandbox (see `exec`)."""

    @abstractmethod
    async def _close(self) -> None:
        """Kill and remove the sandbox; idempotent."""

    def _limit_counts(self) -> LimitCounts:
        """The environment's limit counters now (none by default: no limit to name)."""
        return LimitCounts()

    async def _serve_launch(
        self, argv: list[str], cap: int
    ) -> tuple[list[str], tuple[int, ...], Callable[[], None]]:
        """(the argv that starts `argv` the way `serving` says, the descriptors it needs
        passed, what to do once it is over): here, on the host as it is."""
        return argv, (), lambda: None

    async def reset(self) -> str | None:
        """Bring a used environment back to the state of a never-used one (its processes,
        files and namespace state gone), for a caller that reuses it for an unrelated user;
        None when done, else why it cannot be (the caller closes it then). Only a backend
        that isolates environments can: see `bwrap.reset`."""
        return f"the {self.backend.name} backend does not reset environments"

    async def suspend(self) -> None:
        """Kill everything running in the environment (its files are about to be re-stacked:
        a fork or snapshot); `resume` follows. Nothing to do by default."""

    async def resume(self) -> None:
        """Make the environment usable again after `suspend` (same id, same paths)."""

    # -- shell sessions (`managers.cpu.sessions`) ----------------------------------------------
    async def start_session_host(
        self, name: str, cores: tuple[int, ...], share: float
    ) -> ShellSession:
        """Start the host of session `name` (a shell on a terminal) in a cgroup slot of its
        own, confined to `cores` with a quota of `share` of one core (the background
        allowance), and return once it answers. Only a backend that sandboxes can."""
        raise ValidationError(
            "session",
            name,
            f"the {self.backend.name} backend has no shell sessions (the bwrap backend has)",
        )

    def kernel_driver(self) -> str | None:
        """Where a persistent kernel's driver is inside the sandbox (None: nowhere)."""
        return None

    def session_cores(
        self, session: ShellSession, cores: tuple[int, ...], share: float | None = None
    ) -> None:
        """Give the session's processes `cores` (a command's grant), or with `share` the
        background allowance on them."""

    async def end_session(self, session: ShellSession) -> None:
        """Kill everything of the session (its shell, its background jobs) and free its slot."""

    @property
    def spawned(self) -> bool:
        """Whether its commands start through a spawner that answers a program not on the
        PATH with `spawner.NOT_FOUND` on stderr and exit code 127 (then a caller may start a
        plain command without a shell to say so)."""
        return False


SERVING = ExecSpec(("true",), (0,), 1.0, 0)  # the variables of the server's own work (one core)


def outcome_of(
    exit_code: int | None,
    stdout: bytes,
    stderr: bytes,
    truncated: bool,
    timed_out: bool,
    timeout: float,
    output_cap: int,
) -> Result:
    """Map a finished process to an `Result` whose detail says what happened."""
    out = stdout.decode(errors="replace")
    err = stderr.decode(errors="replace")
    tail = f"; output truncated at {output_cap} bytes per stream" if truncated else ""
    if timed_out:
        return Result(
            Status.TIMEOUT,
            exit_code,
            out,
            err,
            detail=f"killed at its {timeout:g} s timeout with its whole process tree{tail}",
            truncated=truncated,
        )
    if exit_code == 0:
        return Result(Status.OK, 0, out, err, detail=f"exit code 0{tail}", truncated=truncated)
    if exit_code is not None and exit_code < 0:
        try:
            sig = signal.Signals(-exit_code).name
        except ValueError:
            sig = str(-exit_code)
        what = f"killed by signal {sig}"
    elif exit_code == 127:
        first = err.strip().splitlines()[-1] if err.strip() else ""
        what = "exit code 127: command not found" + (f" ({first})" if first else "")
    elif exit_code == 126:
        what = "exit code 126: command not executable"
    else:
        what = f"exit code {exit_code}"
    return Result(Status.ERROR, exit_code, out, err, detail=what + tail, truncated=truncated)


def not_found(command: str, exc: OSError) -> Result:
    return Result(
        Status.ERROR,
        127,
        "",
        str(exc),
        detail=f"exit code 127: command not found ({command!r}: {exc.strerror or exc})",
    )


KillFn = Callable[[], None]
