"""Sandbox uids without root: each environment runs as a uid of the server user's subordinate
range (`/etc/subuid`, `/etc/subgid`), mapped into a user namespace of its own by `newuidmap` and
`newgidmap` (the setuid helpers of shadow's `uidmap` package, which map only what those files
grant the user).

An environment's user namespace (`make_userns`) maps two ids: its uid (and gid) `u` to the host
uid `u` itself (the subordinate range's, so the number is the same inside and out: the root
backend's uid drop, spawner and files API are unchanged) and its root (0) to the server's own
user, who owns the namespace: so the sandbox's setup (bwrap, run as that root) may mount and
drop to `u`, and no command can become anything the host knows but `u`.

Each uid is held by one environment at a time, and never by two servers of the same user at
once: `SubUidAllocator` claims it with a file per uid in the user's runtime folder (naming the
server; a dead server's claims are taken over), removed when the environment closes; a cursor
file makes every server of the user go round the range, so a uid comes back only after every
other one was handed out. The server keeps no descriptor per environment (its open-file limit
bounds how many environments it holds otherwise).

`in_userns` runs a function in a child process that joined an environment's user namespace:
there the server's user holds every capability over the environment's files (its uid and the
server's are the namespace's), which on the host it lacks (the environment's work folder is
mode 0700, owned by its uid): the files API, the work folder's set-up, removal and reset run
through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import pickle
import pwd
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram.errors import BackendUnavailable

CLONE_NEWUSER = 0x10000000
SETUP = "docs/rootless.md"  # where the set-up of subordinate ids and cgroups is explained
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True)
class SubIds:
    """The server user's subordinate ranges: uids [uid, uid + count), gids [gid, gid + count)."""

    user: str
    uid: int
    gid: int
    count: int


def _range(file: str, user: str, uid: int) -> tuple[int, int] | None:
    """The first range `file` grants `user` (by name or uid): (first, count)."""
    try:
        lines = Path(file).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user, str(uid)):
            with contextlib.suppress(ValueError):
                first, count = int(parts[1]), int(parts[2])
                if first > 0 and count > 0:
                    return first, count
    return None


def subids(subuid: str = "/etc/subuid", subgid: str = "/etc/subgid") -> SubIds:
    """This user's subordinate ranges; raises `BackendUnavailable` naming what is missing."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    uids, gids = _range(subuid, user, uid), _range(subgid, user, uid)
    missing = [f for f, r in ((subuid, uids), (subgid, gids)) if r is None]
    if missing:
        raise BackendUnavailable(
            f"user {user} (uid {uid}) has no subordinate id range in {' and '.join(missing)}: "
            f"without one every environment would run as {user}; an administrator adds one "
            f"(`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`, "
            f"see {SETUP})"
        )
    assert uids is not None and gids is not None
    for tool in ("newuidmap", "newgidmap"):
        if shutil.which(tool) is None:
            raise BackendUnavailable(
                f"{tool} not found: it maps the subordinate ids into a user namespace "
                f"(Debian: `apt-get install uidmap`)"
            )
    return SubIds(user, uids[0], gids[0], min(uids[1], gids[1]))


def runtime_dir() -> Path:
    """The user's own runtime folder ($XDG_RUNTIME_DIR, else /run/user/<uid>, else /tmp)."""
    for d in (os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{os.getuid()}"):
        if d and os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return Path(d)
    return Path(f"/tmp/tangram-{os.getuid()}")


class SubUidAllocator:
    """Hands out the uids of `ids`' range, each held by one environment at a time: a claim is
    a file per uid in `folder` naming its server (PID and start time), made with O_EXCL under
    the cursor's lock; a dead server's claims are taken over. No descriptor stays open."""

    def __init__(self, ids: SubIds, folder: Path | None = None) -> None:
        self.ids = ids
        self.folder = (folder or runtime_dir()) / "tangram-uids"
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._me = f"{os.getpid()} {_start_time(os.getpid())}"

    def take(self) -> int:
        """A uid no other environment of this user holds now; raises `BackendUnavailable`."""
        with self._lock:
            try:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                return self._take()
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    raise  # a limit of this host's: the caller names it
                raise BackendUnavailable(
                    f"cannot claim a subordinate uid in {self.folder} ({exc})"
                ) from exc

    def _take(self) -> int:
        cursor = os.open(self.folder / "next", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(cursor, fcntl.LOCK_EX)
            raw = os.pread(cursor, 32, 0).decode().strip()
            start = int(raw) if raw.isdigit() else 0
            # 0 of the range stays unused: the first uid of a range is often someone's root
            for step in range(self.ids.count - 1):
                k = 1 + (start + step) % (self.ids.count - 1)
                if self._claim(self.folder / str(k)):
                    os.ftruncate(cursor, 0)
                    os.pwrite(cursor, str(k).encode(), 0)
                    self._held.add(self.ids.uid + k)
                    return self.ids.uid + k
        finally:
            os.close(cursor)
        raise BackendUnavailable(
            f"every uid of {self.ids.user}'s subordinate range ({self.ids.count}) is held by "
            "an open environment: close some, or grant a larger range"
        )

    def _claim(self, path: Path) -> bool:
        try:
            owner = path.read_text().split()
        except FileNotFoundError:
            owner = None
        if owner is not None:
            pid = int(owner[0]) if owner and owner[0].isdigit() else 0
            if pid > 0 and " ".join(owner[:2]) == f"{pid} {_start_time(pid)}":
                return False  # a live server's (its PID, not a recycled one)
            path.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        try:
            os.write(fd, self._me.encode())
        finally:
            os.close(fd)
        return True

    def gid_of(self, uid: int) -> int:
        return self.ids.gid + (uid - self.ids.uid)

    def release(self, uid: int) -> None:
        with self._lock:
            if uid not in self._held:
                return
            self._held.discard(uid)
        (self.folder / str(uid - self.ids.uid)).unlink(missing_ok=True)

    def holds(self, uid: int) -> bool:
        return uid in self._held


def _start_time(pid: int) -> str:
    """The process's start time (field 22 of /proc/PID/stat), "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def id_maps(uid: int, host_gid: int) -> tuple[list[str], list[str]]:
    """newuidmap's and newgidmap's arguments (after the PID): inside 0 is the server's user,
    inside `uid` is host `uid` (gid: host `host_gid`)."""
    return (
        ["0", str(os.getuid()), "1", str(uid), str(uid), "1"],
        ["0", str(os.getgid()), "1", str(uid), str(host_gid), "1"],
    )


def make_userns(uid: int, host_gid: int) -> int:
    """A descriptor of a new user namespace mapped by `id_maps`; raises `BackendUnavailable`
    naming the refusal (no range, a kernel without unprivileged user namespaces)."""
    return _mapped(*id_maps(uid, host_gid))


def make_range_userns(ids: SubIds) -> int:
    """A user namespace that maps the whole subordinate range to itself (and 0 to the server's
    user): its root may remove any file of any of the user's environments (a dead server's
    leftovers: `BwrapBackend.sweep`)."""
    return _mapped(
        ["0", str(os.getuid()), "1", str(ids.uid), str(ids.uid), str(ids.count)],
        ["0", str(os.getgid()), "1", str(ids.gid), str(ids.gid), str(ids.count)],
    )


def _mapped(uid_args: list[str], gid_args: list[str]) -> int:
    child = subprocess.Popen(
        ["unshare", "--user", "--", "sleep", "60"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        ours = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{child.pid}/ns/user") == ours:
            if child.poll() is not None or time.monotonic() > deadline:
                err = child.stderr.read().decode().strip() if child.stderr else ""
                raise BackendUnavailable(
                    f"cannot create a user namespace ({err or 'unshare --user failed'}): "
                    "the kernel must allow unprivileged user namespaces "
                    "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1)"
                )
            time.sleep(0.0002)
        for tool, args in zip(("newuidmap", "newgidmap"), (uid_args, gid_args), strict=True):
            done = subprocess.run([tool, str(child.pid), *args], capture_output=True, text=True)
            if done.returncode != 0:
                raise BackendUnavailable(
                    f"{tool} refused to map id {args[3]} ({done.stderr.strip()}): "
                    f"is it in this user's range in /etc/sub{tool[3]}id? (see {SETUP})"
                )
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        child.kill()
        child.wait()
        if child.stderr is not None:
            child.stderr.close()


class PassFd(int):
    """A descriptor that `in_userns` sends back (as a new descriptor of the caller's)."""


def in_userns(ns: int, fn: Callable[..., Any], *args: Any, here: bool = False) -> Any:
    """`fn(*args)` run in a child process that joined the user namespace `ns` (with every
    capability there); its result (or exception) comes back pickled, a `PassFd` as a
    descriptor of this process. The child is the helper's (`OwnerHelper`: `fn` a module-level
    function, `args` picklable values) or, with `here` (arguments that are this process's
    descriptors or objects), this process's own."""
    if not here and fn.__module__ != "__main__" and "<" not in fn.__qualname__:
        try:
            return HELPER.call(ns, fn, *args)
        except _HelperGone:
            pass  # (it died mid-call: once more, by a fork of this process)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child: reported through the socket)
        ours.close()
        _child(theirs, ns, fn, args)
    theirs.close()
    try:
        return _result(ours, pid)
    finally:
        ours.close()


def _join(ns: int) -> None:
    if _libc.setns(ns, CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into the environment's user namespace: {os.strerror(err)}")


def _answer(sock: socket.socket, call: Callable[[], Any]) -> None:
    """Run `call` and send its result (or exception; a `PassFd` as a descriptor) on `sock`."""
    fds: list[int] = []
    try:
        value = call()
        if isinstance(value, PassFd):
            fds, value = [int(value)], PassFd(-1)
        out = pickle.dumps((True, value))
    except BaseException as exc:
        try:
            out = pickle.dumps((False, exc))
            pickle.loads(out)  # (one that cannot come back whole comes back as its text)
        except Exception:
            out = pickle.dumps((False, OSError(f"{type(exc).__name__}: {exc}")))
    try:
        socket.send_fds(sock, [len(out).to_bytes(8, "little")], fds)
        sock.sendall(out)
    finally:
        for fd in fds:
            os.close(fd)


def _child(sock: socket.socket, ns: int, fn: Callable[..., Any], args: tuple) -> None:
    code = 0
    try:
        _answer(sock, lambda: (_join(ns), fn(*args))[1])
    except BaseException:
        code = 1
    finally:
        os._exit(code)


class _HelperGone(OSError):
    """The helper (or its child) died before it answered."""


def _result(sock: socket.socket, pid: int | None) -> Any:
    try:
        head, fds, _, _ = socket.recv_fds(sock, 8, 1)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        chunks, got = [], 0
        while 0 <= got < size:
            chunk = sock.recv(min(size - got, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        if pid is not None:
            os.waitpid(pid, 0)
    if size < 0 or got != size:
        for fd in fds:
            os.close(fd)
        raise _HelperGone("the helper in the environment's user namespace died")
    ok, value = pickle.loads(b"".join(chunks))
    if not ok:
        raise value
    return PassFd(fds[0]) if isinstance(value, PassFd) and fds else value


class OwnerHelper:
    """A small process of the server's, started once, that runs `in_userns`'s work for it:
    per call it forks (its memory is small, so a fork costs a fraction of the server's) a
    child that joins the environment's user namespace, runs the function (named by module and
    name: a module-level one) and answers on a socket pair of that call's. Calls from any
    thread run at once, each in its own child. Restarted if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    def _start(self) -> socket.socket:
        if self._proc is not None and self._proc.poll() is None and self._sock is not None:
            return self._sock
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"from managers.cpu.subids import helper_main; helper_main({theirs.fileno()})"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        self._sock = ours
        return ours

    def call(self, ns: int, fn: Callable[..., Any], *args: Any) -> Any:
        request = pickle.dumps((fn.__module__, fn.__qualname__, args))
        mine, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                try:
                    sock = self._start()
                    socket.send_fds(sock, [request], [ns, child.fileno()])
                except OSError as exc:  # (it could not start, or died): the caller forks
                    self.close()
                    raise _HelperGone(f"the helper is gone ({exc})") from exc
            child.close()
            return _result(mine, None)
        finally:
            child.close()
            mine.close()

    def drop(self, key: tuple[int, int]) -> None:
        """End the worker of the user namespace `key` (its device and inode), if any."""
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.send(f"drop {key[0]} {key[1]}".encode())

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait()
            self._proc = None


def helper_main(fd: int) -> None:  # pragma: no cover (a process of its own: OwnerHelper)
    """The helper's loop: a request is (module, name, args) with two descriptors, the user
    namespace and the call's answering socket. A worker per user namespace (a forked child
    that joined it, `_worker`) runs the calls for it, kept for the next ones (the last
    `WORKERS` namespaces used); b"drop <dev> <ino>" ends the worker of a closed environment."""
    import importlib
    import signal
    from collections import OrderedDict

    for module in PRELOAD:  # once, here: each child would import them again
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    sock = socket.socket(fileno=fd)
    workers: OrderedDict[tuple[int, int], socket.socket] = OrderedDict()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        except OSError:
            return
        if not data:
            return
        if data.startswith(b"drop ") or len(fds) != 2:
            key = tuple(int(x) for x in data.split()[1:3]) if data.startswith(b"drop ") else None
            w = workers.pop(key, None) if key else None  # type: ignore[arg-type]
            if w is not None:
                w.close()
        else:
            st = os.fstat(fds[0])
            _dispatch(workers, (st.st_dev, st.st_ino), data, fds, sock)
        for f in fds:
            os.close(f)


def _dispatch(workers, key, data: bytes, fds: list[int], sock: socket.socket) -> None:
    w = workers.get(key)
    if w is not None:
        try:
            socket.send_fds(w, [data], [fds[1]])
            workers.move_to_end(key)
            return
        except OSError:
            workers.pop(key).close()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        sock.close()
        ours.close()
        for other in workers.values():
            other.close()
        _worker(theirs, fds[0])
    theirs.close()
    socket.send_fds(ours, [data], [fds[1]])
    workers[key] = ours
    while len(workers) > WORKERS:
        workers.popitem(last=False)[1].close()


def _worker(sock: socket.socket, ns: int) -> None:  # pragma: no cover (a process of its own)
    """Join the user namespace, then run each call sent on `sock` until it closes."""
    import importlib

    code = 0
    try:
        try:
            _join(ns)
            joined: OSError | None = None
        except OSError as exc:
            joined = exc
        os.close(ns)
        while True:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
            if not data or not fds:
                break
            answer = socket.socket(fileno=fds[0])
            module, name, args = pickle.loads(data)

            def call(module=module, name=name, args=args):
                if joined is not None:
                    raise joined
                fn: Any = importlib.import_module(module)
                for part in name.split("."):
                    fn = getattr(fn, part)
                return fn(*args)

            with contextlib.suppress(OSError):
                _answer(answer, call)
            answer.close()
    except BaseException:
        code = 1
    finally:
        os._exit(code)


HELPER = OwnerHelper()  # (started on first use)
WORKERS = 64  # user namespaces whose worker the helper keeps
# what the helper's calls run (imported before its first fork)
PRELOAD = (
    "managers.cpu.files",
    "managers.cpu.envfiles",
    "managers.cpu.backends.bwrap.rootless",
    "managers.cpu.backends.bwrap.reset",
)
