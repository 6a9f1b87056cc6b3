"""Run one local process for a backend: own session, output capped, process tree killed at the
deadline and after exit (so no stray process keeps using cores that went back to the pool).

Lean by design (this is the per-exec path): `subprocess.Popen` (vfork) with the exit watched
through a pidfd and the pipes read by the event loop, instead of asyncio's subprocess machinery,
whose default child watcher starts a thread per process (milliseconds on a busy machine). The
exit is noticed when the command exits even while a leftover child still holds the pipes, so
leftovers are killed at once instead of keeping the exec (and its cores) alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext

from managers.cpu.backends.base import not_found, outcome_of
from managers.cpu.backends.limits import raise_if_out_of_files
from tangram.results import Result

READ_CHUNK = 1 << 16
DRAIN_GRACE_S = 0.5  # after the tree is killed, how long pipes held by escaped children may stay


class _Capture:
    """Reads a process's stdout and stderr on the loop, keeping at most `cap` bytes of each."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fds: list[int], cap: int) -> None:
        self.loop, self.cap = loop, cap
        self.kept = {fd: bytearray() for fd in fds}
        self.truncated = False
        self.closed = loop.create_future()
        self._open = set(fds)
        for fd in fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(fd)
            return
        kept = self.kept[fd]
        room = self.cap - len(kept)
        if room > 0:
            kept += data[:room]
        if len(data) > room:
            self.truncated = True

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            self.loop.remove_reader(fd)
            os.close(fd)
        if not self._open and not self.closed.done():
            self.closed.set_result(None)

    def abandon(self) -> None:
        """Stop reading pipes still held open (by a process that escaped every kill)."""
        if self._open:
            self.truncated = True
        for fd in list(self._open):
            self._close(fd)


async def _exited(proc: subprocess.Popen) -> None:
    """Wait for the exit and reap: a pidfd on Linux >= 5.3, else a thread."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        await asyncio.to_thread(proc.wait)
        return
    done = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, ready)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    proc.wait()


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _start(
    argv: list[str],
    cwd: str | None,
    env: Mapping[str, str] | None,
    spawning: Callable[[], AbstractContextManager[object]],
    kill_rest: Callable[[], None] | None,
    pass_fds: tuple[int, ...],
) -> subprocess.Popen | Result:
    """`run_local`'s spawn: the process, or the result of a program that cannot start."""
    try:
        with spawning():
            return subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=pass_fds,
            )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        if kill_rest is not None:
            kill_rest()
        return not_found(argv[0], exc)
    except OSError as exc:  # out of descriptors: a 503 naming the limit, not a 500
        if kill_rest is not None:
            kill_rest()
        raise_if_out_of_files(exc)
        raise


async def run_local(
    argv: list[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout: float,
    output_cap: int,
    spawning: Callable[[], AbstractContextManager[object]] = nullcontext,
    kill_rest: Callable[[], None] | None = None,
    pass_fds: tuple[int, ...] = (),
    groups: set[int] | None = None,
) -> Result:
    """Run `argv` in a new session. `spawning()` is entered around the (synchronous) spawn, in
    the spawning thread, whose state the child inherits (affinity); `kill_rest` kills whatever
    else belongs to this exec (a cgroup's pids); `pass_fds` stay open in the child; `groups`
    holds the session's process group while it runs (so a close can kill it)."""
    proc = _start(argv, cwd, env, spawning, kill_rest, pass_fds)
    if isinstance(proc, Result):  # the program could not start
        return proc
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
    proc.stdout.close()
    proc.stderr.close()
    capture = _Capture(asyncio.get_running_loop(), [out_fd, err_fd], output_cap)
    if groups is not None:
        groups.add(proc.pid)
    exited = asyncio.ensure_future(_exited(proc))
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(exited), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        # the group and (where known) the cgroup: children that escaped the group die too
        kill_group(proc.pid)
        if kill_rest is not None:
            kill_rest()
        if not exited.done():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(exited)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(capture.closed), DRAIN_GRACE_S)
        capture.abandon()
        if groups is not None:
            groups.discard(proc.pid)
    return outcome_of(
        proc.returncode,
        bytes(capture.kept[out_fd]),
        bytes(capture.kept[err_fd]),
        capture.truncated,
        timed_out,
        timeout,
        output_cap,
    )
