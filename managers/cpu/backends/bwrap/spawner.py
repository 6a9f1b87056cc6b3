"""The fast exec path of the bwrap backend: a resident spawner inside each sandbox.

Entering a sandbox per exec (a joining shell, `nsenter` into six namespaces, `setpriv`) costs
several milliseconds of process starts. Instead, each sandbox's holder is a small resident
program (`spawner_native`, built with the host's C compiler; else `spawner_inside.py`, run by
the server's own Python) that forks the commands it is sent. It runs as the sandbox's uid with
no capabilities and `no_new_privs` (as every command did before) and is non-dumpable; per
command the C one `vfork`s a child that moves itself into the exec's cgroup slot (through
cgroup.procs files the server opened, passed over the socket: the sandbox sees no cgroup file)
and becomes the command (the Python one moves itself in, `posix_spawn`s and moves back), so the
command is confined from its first instruction. What the server
does per exec: two pipes, a memfd holding the request, one message; the start and the exit come
back as one message each, and the timeout counts from the start. The commands inherit the
sandbox's seccomp filter (bwrap loads it before the spawner starts; no loader runs per
command), and a stream that passes the output cap is handed to the spawner, which drops the
rest inside the sandbox, on its cores (the server reads no more than the cap and one chunk).

The contract is the backend's: output capped per stream, the command's whole cgroup slot killed
at the timeout and after the exit, the exit code as `subprocess` gives it (negative: a signal).
The commands run as the spawner's own uid, so a command can signal it (never ptrace it or read
its fds: it is non-dumpable); one that kills it ends its own sandbox only: the commands in
flight come back killed, saying so, and the backend restarts the sandbox (a fresh /tmp, the
same work directory) before the next exec, as it does for any holder that died.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from managers.cpu.backends.base import EnvironmentBroken, outcome_of
from managers.cpu.backends.bwrap import spawner_native as native
from managers.cpu.backends.process import DRAIN_GRACE_S, _Capture
from managers.cpu.request import ExecSpec
from tangram.results import Result, Status

INSIDE_SOURCE = Path(__file__).with_name("spawner_inside.py")
INSIDE_NAME = "tangram_spawner.py"
KILL_GRACE_S = 5.0  # after a kill, how long the spawner may take to report the exit
START_TIMEOUT_S = 10.0  # how long the spawner may take to start a command
# the stderr line (exit code 127) of both spawners, `spawner_native` and `spawner_inside`, for a
# command whose program is not on its PATH: (program, PATH)
NOT_FOUND = re.compile(r"tangram spawner: cannot run the command: (\S+): not found on PATH (\S*)")
SETPRIV_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # setpriv drops them all


def install(folder: Path, inside: str, python: str) -> tuple[str, ...]:
    """Put the spawner into `folder` (seen as `inside` in the sandbox): the native one where a
    C compiler builds it (`spawner_native`), else a copy of the Python one (world-readable),
    run by `python`. Returns its command line inside, before the socket and the folder."""
    if native.build(folder):
        return (f"{inside}/{native.NATIVE_NAME}",)
    target = folder / INSIDE_NAME
    target.write_bytes(INSIDE_SOURCE.read_bytes())
    target.chmod(0o644)
    return (python, "-I", "-S", f"{inside}/{INSIDE_NAME}")


def request_bytes(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """The memfd's content: the argv count, the argv items, the KEY=VALUE items, each ended by
    a NUL (none of them may hold one: the kernel's exec would refuse them too)."""
    items = [str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    if any("\0" in i for i in items):
        raise ValueError("a command's argument or environment holds a NUL byte")
    return "".join(i + "\0" for i in items).encode("utf-8", "surrogateescape")


class Spawner:
    """The server's end of one sandbox's spawner socket. Runs on the event loop's thread."""

    def __init__(self, sock: socket.socket, reopen: bool = False) -> None:
        """`reopen`: pass the cgroup.procs files as O_PATH descriptors, which the spawner
        reopens as the environment's uid (rootless: cgroup v1 checks the opener's uid)."""
        self.sock = sock
        self._procs_flags = os.O_PATH if reopen else os.O_WRONLY
        self.sock.setblocking(False)
        self._ids = itertools.count()
        # id -> (started, ended): the command runs; its exit code
        self._pending: dict[str, tuple[asyncio.Future[int], asyncio.Future[int]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead: str | None = None

    def _attach(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(256)
            except BlockingIOError:
                return
            except OSError as exc:
                msg, why = b"", str(exc)
            else:
                why = "its spawner exited"
            if not msg:
                self._fail(why)
                return
            verb, cid, code = msg.decode().split(" ")
            futs = self._pending.get(cid)
            if futs is None:
                continue
            started, ended = futs
            if not started.done():
                started.set_result(0)
            if verb == "exit" and not ended.done():
                ended.set_result(int(code))

    def _fail(self, why: str) -> None:
        self.dead = why
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        for futs in self._pending.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(EnvironmentBroken(f"the sandbox is gone ({why})"))
        self._pending.clear()

    def close(self) -> None:
        if self._loop is not None and self.dead is None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.sock.fileno())
        self.dead = self.dead or "closed"
        self.sock.close()

    async def run(
        self,
        spec: ExecSpec,
        *,
        env: Mapping[str, str],
        cgroups: Sequence[Path],
        home: Sequence[Path],
        kill_rest: Callable[[], None],
    ) -> Result:
        """Run `spec`'s command in the sandbox's work directory, with the variables `env`, in
        the cgroups whose cgroup.procs are `cgroups` (`home`: those of the holder's own slot,
        where the spawner returns; a file in both is written neither way). Its timeout counts
        from the command's start, not from the request. Output past its cap is drained by the
        spawner, inside the sandbox."""
        argv, timeout, output_cap = spec.argv, spec.timeout, spec.output_cap
        self._attach()
        if self.dead is not None:
            raise EnvironmentBroken(f"the sandbox is gone ({self.dead})")
        loop = asyncio.get_running_loop()
        cid = str(next(self._ids))
        started: asyncio.Future[int] = loop.create_future()
        ended: asyncio.Future[int] = loop.create_future()
        both = set(cgroups) & set(home)
        out_r, err_r = self._send(
            cid,
            argv,
            env,
            [c for c in cgroups if c not in both],
            [h for h in home if h not in both],
            (started, ended),
        )
        capture = _Handing(loop, [out_r, err_r], output_cap, lambda fd: self._hand_over(cid, fd))
        code, timed_out, lost = await self._wait(cid, started, ended, timeout, kill_rest)
        if not capture.closed.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(capture.closed), DRAIN_GRACE_S)
        capture.abandon()
        out, err = bytes(capture.kept[out_r]), bytes(capture.kept[err_r])
        if lost:
            return Result(
                Status.ERROR,
                None,
                out.decode(errors="replace"),
                err.decode(errors="replace"),
                truncated=capture.truncated,
                detail=f"killed: the sandbox's spawner died while the command ran "
                f"({self.dead}); the sandbox restarts before the next exec",
            )
        return outcome_of(code, out, err, capture.truncated, timed_out, timeout, output_cap)

    def _send(
        self,
        cid: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cgroups: Sequence[Path],
        home: Sequence[Path],
        futs: tuple[asyncio.Future[int], asyncio.Future[int]],
    ) -> tuple[int, int]:
        """Hand the command over: returns the read ends of its stdout and stderr."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        passed = [out_w, err_w]
        try:
            memfd = os.memfd_create("tangram-exec", os.MFD_CLOEXEC)
            passed.insert(0, memfd)
            os.write(memfd, request_bytes(argv, env))
            for procs in (*cgroups, *home):
                passed.append(os.open(procs, self._procs_flags | os.O_CLOEXEC))
            self._pending[cid] = futs
            self.sock.sendmsg(
                [f"run {cid} {len(cgroups)}".encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", passed))],
            )
        except OSError as exc:
            self._pending.pop(cid, None)
            os.close(out_r)
            os.close(err_r)
            raise EnvironmentBroken(f"cannot hand the command to the sandbox ({exc})") from exc
        finally:
            for fd in passed:
                os.close(fd)
        return out_r, err_r

    def _hand_over(self, cid: str, fd: int) -> bool:
        """Pass a pipe whose output passed the cap to the spawner, which drops the rest."""
        if self.dead is not None or cid not in self._pending:
            return False
        try:
            self.sock.sendmsg(
                [f"drain {cid}".encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
            )
        except OSError:
            return False
        return True

    async def _wait(
        self,
        cid: str,
        started: asyncio.Future[int],
        ended: asyncio.Future[int],
        timeout: float,
        kill_rest: Callable[[], None],
    ) -> tuple[int | None, bool, bool]:
        """Wait for the start, then the exit within `timeout`; kill the slot. Returns the exit
        code, whether it timed out, and whether the spawner died meanwhile."""
        timed_out = lost = False
        code: int | None = None
        try:
            try:
                if started.done():  # (a wait on a done future costs a timer and two futures)
                    started.result()
                else:
                    await asyncio.wait_for(asyncio.shield(started), START_TIMEOUT_S)
                code = await asyncio.wait_for(asyncio.shield(ended), timeout)
            except EnvironmentBroken:
                lost = True  # the command (the spawner's own uid) may have killed it
            except TimeoutError:
                if not started.done():
                    raise EnvironmentBroken(
                        f"the sandbox's spawner did not start a command "
                        f"within {START_TIMEOUT_S:g} s"
                    ) from None
                raise
        except TimeoutError:
            timed_out = True
        finally:
            kill_rest()  # the slot: the command and whatever it left
            if not ended.done() and self.dead is None:
                with contextlib.suppress(OSError):
                    self.sock.send(f"kill {cid}".encode())
                with contextlib.suppress(TimeoutError, EnvironmentBroken):
                    code = await asyncio.wait_for(asyncio.shield(ended), KILL_GRACE_S)
            self._pending.pop(cid, None)
        return code, timed_out, lost


class _Handing(_Capture):
    """A capture that, once a stream passes the cap, hands its pipe to the spawner to drain
    inside the sandbox (`over(fd)`: True when handed) instead of reading on in the server."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fds: list[int], cap: int, over: Callable[[int], bool]
    ) -> None:
        super().__init__(loop, fds, cap)
        self._over = over

    def _read(self, fd: int) -> None:
        super()._read(fd)
        if (
            fd in self._open
            and len(self.kept[fd]) >= self.cap
            and self.truncated
            and self._over(fd)
        ):
            self._close(fd)
