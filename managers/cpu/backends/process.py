"""Run one local process for a backend: own session, output capped, process tree killed at the
deadline and after exit (so no stray process keeps using cores that went back to the pool).

A subprocess protocol rather than `asyncio.subprocess.Process`: its `process_exited` fires when
the command exits even while a leftover child still holds the pipes, so leftovers are killed at
once instead of keeping the exec (and its cores) alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping

from managers.base import Outcome
from managers.cpu.backends.base import not_found, outcome_of

DRAIN_GRACE_S = 0.5  # after the tree is killed, how long pipes held by escaped children may stay


class _Capture(asyncio.SubprocessProtocol):
    """Keeps at most `cap` bytes of stdout and of stderr; drains and drops the rest."""

    def __init__(self, cap: int, loop: asyncio.AbstractEventLoop) -> None:
        self.cap = cap
        self.out, self.err = bytearray(), bytearray()
        self.truncated = False
        self.exited = loop.create_future()
        self.closed = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.out if fd == 1 else self.err
        room = self.cap - len(kept)
        if room > 0:
            kept += data[:room]
        if len(data) > room:
            self.truncated = True

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_local(argv: list[str], *, cwd: str | None, env: Mapping[str, str] | None,
                    timeout: float, output_cap: int,
                    preexec: Callable[[], None] | None = None,
                    kill_rest: Callable[[], None] | None = None) -> Outcome:
    """Run `argv` in a new session. `preexec` runs in the child before exec (affinity);
    `kill_rest` kills whatever else belongs to this exec (a cgroup's pids)."""
    loop = asyncio.get_running_loop()
    proto = _Capture(output_cap, loop)
    try:
        transport, _ = await loop.subprocess_exec(
            lambda: proto, *argv, cwd=cwd, env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=preexec)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        if kill_rest is not None:
            kill_rest()
        return not_found(argv[0], exc)
    pid = transport.get_pid()
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(proto.exited), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        # the group and (where known) the cgroup: children that escaped the group die too
        kill_group(pid)
        if kill_rest is not None:
            kill_rest()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(proto.closed), DRAIN_GRACE_S)
        if not proto.closed.done():  # a pipe is still held open by an escaped process
            proto.truncated = True
        transport.close()
    return outcome_of(transport.get_returncode(), bytes(proto.out), bytes(proto.err),
                      proto.truncated, timed_out, timeout, output_cap)
