"""The resident spawner: runs inside each bwrap sandbox (as its holder) and starts commands.

Not imported by the server: `spawner.py` copies this file into the sandbox's support folder
and the sandbox runs it with the server's Python (`-I -S`: nothing of the environment or site
packages is read), already as the sandbox's own uid with no capability, no groups and
`no_new_privs` (`setpriv`, as every command was before). It makes itself non-dumpable, so the
commands, which run as the same uid, can neither ptrace it nor read its memory or fds.

Protocol, on the SOCK_SEQPACKET socket given as argv[1] (the server holds the other end):

    server -> spawner   b"run <id> <k>" + fds [request memfd, stdout, stderr, the k cgroup.procs
                        files of the exec's slot, the cgroup.procs files of the holder's slot]
                        (the memfd holds "<n>\0", the n argv items and the environment's
                        "KEY=VALUE" items, each ending in "\0"; the cgroup.procs files were
                        opened for writing by the server outside the sandbox, and the kernel
                        checks the opener's credentials: no cgroup file is visible inside)
    spawner -> server   b"started <id> 0"       the command runs (or b"exit <id> 127" with the
                                                reason on its stderr when it cannot start)
    server -> spawner   b"kill <id>"            SIGKILL the command's process group
    server -> spawner   b"drain <id>" + fd      the read end of a pipe of the command whose
                                                output passed the cap: read and dropped here
                                                (on the sandbox's cores) until its end or the
                                                command's exit, so the server reads no more
    spawner -> server   b"exit <id> <code>"     the command ended (negative: killed by signal)

Per command the spawner moves itself into the exec's cgroup slot, starts the command there with
`posix_spawn` (vfork: no copy of this process; a session of its own, /dev/null as stdin, the
work directory as cwd) and moves itself back, so the command is confined from its first
instruction. The spawner exits when the server's end closes.
"""

import _ctypes  # the C modules only: no enum, no re, no ctypes (start-up is paid per sandbox)
import _signal as signal
import _socket as socket
import array
import errno
import os
import select
import sys

PR_SET_DUMPABLE = 4
MAX_FDS = 32


def non_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): the commands (same uid) cannot ptrace this process or open
    its /proc files. Through `_ctypes` directly (`ctypes` costs milliseconds to import)."""
    call = getattr(_ctypes, "call_function", None)
    if call is not None:
        if call(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"), (PR_SET_DUMPABLE, 0, 0, 0, 0)):
            raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
        return
    import ctypes  # only where _ctypes lacks call_function

    if ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


def resolve(name: str, path: str) -> str:
    if "/" in name:
        return name
    for d in path.split(":"):
        candidate = f"{d or '.'}/{name}"
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    # the line the native spawner writes too (`NOT_FOUND`): no "[Errno 2]" prefix
    raise FileNotFoundError(f"{name}: not found on PATH {path}")


def move(fds) -> None:
    for fd in fds:
        try:
            os.write(fd, b"0")
        except OSError as exc:  # an O_PATH descriptor (rootless): reopened as this uid
            if exc.errno != errno.EBADF:
                raise
            again = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(again, b"0")
            finally:
                os.close(again)


def parse(raw: bytes) -> tuple[list[str], dict[str, str]]:
    items = raw.decode("utf-8", "surrogateescape").split("\0")
    n = int(items[0])
    argv, env = items[1 : 1 + n], items[1 + n : -1]
    return argv, dict(kv.split("=", 1) for kv in env)


def spawn(raw: bytes, out: int, err: int, slot: list[int], home: list[int]) -> int:
    """Start the command in the exec's slot; returns its pid (raises OSError)."""
    argv, env = parse(raw)
    exe = resolve(argv[0], env.get("PATH", ""))
    move(slot)
    try:
        return os.posix_spawn(
            exe,
            argv,
            env,
            setsid=True,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, err, 2),
            ],
        )
    finally:
        move(home)


def read_all(fd: int) -> bytes:
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(256, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    for fd in fds:
        os.set_inheritable(fd, False)
    return msg, list(fds)


class Spawner:
    """The commands in flight (pid <-> id) and the pipes drained for them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.running: dict[int, str] = {}  # pid -> id
        self.by_id: dict[str, int] = {}
        self.drains: dict[int, str] = {}  # read end -> id

    def reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            cid = self.running.pop(pid, None)
            if cid is not None:
                self.by_id.pop(cid, None)
                for fd in [fd for fd, c in self.drains.items() if c == cid]:
                    self.undrain(fd)  # leftovers holding the pipe do not keep it
                self.sock.send(f"exit {cid} {os.waitstatus_to_exitcode(status)}".encode())

    def drain(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.undrain(fd)

    def undrain(self, fd: int) -> None:
        self.drains.pop(fd, None)
        os.close(fd)

    def kill(self, cid: str) -> None:
        pid = self.by_id.get(cid)
        if pid is not None:
            for target in (-pid, pid):
                try:
                    os.kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def handle(self, words: list[str], fds: list[int]) -> list[int]:
        """Act on one message; returns the descriptors to close now."""
        if words[0] == "kill" and len(words) == 2:
            self.kill(words[1])
        elif words[0] == "drain" and len(words) == 2 and len(fds) == 1:
            if words[1] in self.by_id:
                os.set_blocking(fds[0], False)
                self.drains[fds[0]] = words[1]
                return []
        elif words[0] == "run" and len(words) == 3 and len(fds) >= 3:
            cid, k = words[1], int(words[2])
            try:
                pid = spawn(read_all(fds[0]), fds[1], fds[2], fds[3 : 3 + k], fds[3 + k :])
            except (OSError, ValueError, KeyError, IndexError) as exc:
                os.write(fds[2], f"tangram spawner: cannot run the command: {exc}\n".encode())
                self.sock.send(f"exit {cid} 127".encode())
            else:
                self.running[pid] = cid
                self.by_id[cid] = pid
                self.sock.send(f"started {cid} 0".encode())
        return fds


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))  # AF_UNIX, SOCK_SEQPACKET
    os.set_inheritable(sock.fileno(), False)
    os.chdir(sys.argv[2])
    non_dumpable()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    s = Spawner(sock)
    os.write(1, b"ready\n")
    os.close(1)
    while True:
        ready, _, _ = select.select([sock, wake_r, *s.drains], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        for fd in ready:
            if fd in s.drains:
                s.drain(fd)
        s.reap()
        if sock not in ready:
            continue
        msg, fds = receive(sock)
        if not msg:
            return  # the server is gone
        for fd in s.handle(msg.decode().split(" "), fds):
            os.close(fd)


if __name__ == "__main__":
    main()
