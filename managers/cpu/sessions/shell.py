"""The server's side of a shell session (see the package docstring and `host`).

A request goes to the session's host over a fresh connection to its Unix socket in the
sandbox's `/tmp`, found from the sandbox's root with `openat2(RESOLVE_IN_ROOT)`: a link a
command planted there never leads the server to a socket of the host's. The answer maps to a
`Result` as an exec's does: exit 0 `ok`, another code `error`, a timeout `timeout` (the command
interrupted, the session alive), a shell that is gone `failed` naming how it went.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from managers.cpu import files
from managers.cpu.subids import PassFd
from tangram.errors import ValidationError
from tangram.results import Result, Status

HOST_SOURCE = Path(__file__).with_name("host.py")
HOST_NAME = "tangram_session_host.py"  # in the support folder, seen inside the sandbox
KERNEL_SOURCE = Path(__file__).with_name("kernel.py")
KERNEL_NAME = "tangram_kernel_driver.py"  # beside it: a persistent kernel's driver
SOCKET_DIR = "tmp/.tangram-sessions"  # from the sandbox's root (`host.SOCKET_DIR`)
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
MAX_SESSIONS = 64  # per environment
HOST_START_S = 10.0  # how long a new host may take to answer
REPLY_GRACE_S = 30.0  # past a command's timeout: its interruption, resync and answer
MAX_REPLY = 64 << 20  # bytes of one answer (the output cap bounds it well below)
RESOLVE_SOCKET = files.RESOLVE_IN_ROOT | files.RESOLVE_NO_MAGICLINKS  # /tmp is a mount of its own


class SessionGone(Exception):
    """The session's host does not answer (its socket is gone: the sandbox restarted)."""


def check_name(name: object) -> str:
    """A session name: 1-64 of letters, digits, `_`, `.`, `-`, not starting with `.`/`-`."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ValidationError(
            "session", name, "must be 1-64 letters, digits, '_', '.' or '-' (not first: . -)"
        )
    return name


def host_key(name: str) -> str:
    """The host's file names for session `name` (a hash: fixed length, no user text)."""
    return "s-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def install_host(folder: Path) -> None:
    """Put the host's and the kernel driver's sources into the support folder
    (world-readable)."""
    for source, name in ((HOST_SOURCE, HOST_NAME), (KERNEL_SOURCE, KERNEL_NAME)):
        target = folder / name
        target.write_bytes(source.read_bytes())
        target.chmod(0o644)


def _connected(rootfd: int, name: str, key: str) -> PassFd:
    """A descriptor of a socket connected to the session's host (`ShellSession._connect`)."""
    fd = -1
    try:
        try:
            fd = files.openat2(
                rootfd,
                f"{SOCKET_DIR}/{key}.sock",
                os.O_PATH | os.O_NOFOLLOW,
                resolve=RESOLVE_SOCKET,
            )
        except OSError as exc:
            raise SessionGone(f"session {name}: no host socket ({exc.strerror})") from exc
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise SessionGone(f"session {name}: its socket was replaced")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(f"/proc/self/fd/{fd}")
        except OSError as exc:
            sock.close()
            raise SessionGone(f"session {name}: its host does not answer ({exc})") from exc
        return PassFd(sock.detach())
    finally:
        if fd >= 0:
            os.close(fd)


@dataclass(eq=False, slots=True)
class ShellSession:
    """One open session: its `name`, its host's file names (`key`), the backend's cgroup slot
    its processes live in (`slot`), how to reach the sandbox's root (`root`: a directory
    descriptor the caller closes, None when the sandbox is gone), the request counter, and one
    lock (one command at a time)."""

    name: str
    key: str
    slot: Any
    root: Callable[[], int | None]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dead: str | None = None  # why its shell is gone, once a request found it so
    n: int = 0
    # runs the connection with the server's authority over the sandbox's files (a rootless
    # sandbox's: in a child that joined its user namespace, `Sandbox.owner_call`)
    owner_call: Callable[..., Any] | None = None

    async def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and read its answer; raises `SessionGone` when the host cannot be
        reached, TimeoutError past `timeout`."""
        sock = await asyncio.to_thread(self._connect)
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock)
        except BaseException:
            sock.close()
            raise
        try:
            writer.write(json.dumps(req).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if not line:
            raise SessionGone(f"session {self.name}: its host closed the connection")
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise SessionGone(f"session {self.name}: its host answered {answer!r}")
        return answer

    def _connect(self) -> socket.socket:
        """A connected socket to the host, through a descriptor of the socket file resolved
        inside the sandbox's root (never following a link out of it)."""
        rootfd = self.root()
        if rootfd is None:
            raise SessionGone(f"session {self.name}: the sandbox is not running")
        try:
            call = self.owner_call or (lambda fn, *args: fn(*args))
            sock = socket.socket(fileno=call(_connected, rootfd, self.name, self.key))
        finally:
            os.close(rootfd)
        sock.setblocking(False)
        return sock

    async def wait_ready(self) -> None:
        """Return once the new host answers a ping; `SessionGone` after `HOST_START_S`."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + HOST_START_S, 0.002
        while True:
            try:
                answer = await self.request({"op": "ping"}, HOST_START_S)
            except SessionGone as exc:
                if loop.time() > deadline:
                    why = f"session {self.name}: its shell did not start ({exc})"
                    raise SessionGone(why) from exc
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)
                continue
            if answer.get("dead"):
                raise SessionGone(f"session {self.name}: {answer['dead']}")
            return


def outcome(answer: dict[str, Any], name: str, timeout: float, cap: int) -> Result:
    """The `Result` of one answer of the host (see the module docstring)."""
    out = answer.get("output", "")
    out = out if isinstance(out, str) else ""
    if not answer.get("ok"):
        why = answer.get("dead") or answer.get("error") or "no answer"
        return Result(
            Status.FAILED,
            None,
            out,
            detail=f"session {name}: {why}; open it again to go on",
        )
    truncated = bool(answer.get("truncated"))
    tail = f"; output truncated at {cap} bytes" if truncated else ""
    code = answer.get("exit_code")
    matched = answer.get("matched")
    if answer.get("timed_out"):
        return Result(
            Status.TIMEOUT,
            None,
            out,
            detail=f"interrupted at its {timeout:g} s timeout (SIGINT, then SIGKILL to its "
            f"process group); the session goes on{tail}",
            truncated=truncated,
        )
    if code is None:  # an interactive request ended by its program's own prompt
        what = f"matched {matched!r}" if matched else "the program answered"
        return Result(Status.OK, None, out, detail=what + tail, truncated=truncated)
    if code == 0:
        return Result(Status.OK, 0, out, detail=f"exit code 0{tail}", truncated=truncated)
    return Result(Status.ERROR, code, out, detail=f"exit code {code}{tail}", truncated=truncated)
