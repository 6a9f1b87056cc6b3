"""The session host: one per shell session, inside the environment's sandbox (its namespaces,
its uid, its seccomp filter, its cgroup slot). Standard library only, Python 3.8+: it runs
under the server's Python where the sandbox sees it, else an image's own `python3`.

It starts `bash` on a pseudo-terminal (so interactive programs, `python3`, `pdb`, behave as at
a terminal, as SWE-ReX's sessions do), holds the terminal's master side, and answers requests
on a Unix socket in the sandbox's `/tmp` (`SOCKET_DIR`): one JSON line in, one JSON line out,
one connection per request, so the server holds no descriptor for an idle session.

A command is written to a file beside the socket and sourced by the shell, followed by a
marker that carries the session's random token, the request's number and `$?`: its output is
what the terminal printed before the marker, its exit code the marker's. The shell's state
(working folder, variables, functions, background jobs) persists from one command to the
next. An interactive request (`interactive`) writes its text to the terminal as typed and
waits for one of its `expect` strings (a program's own prompt) or the marker.

A command that reaches its timeout is interrupted: SIGINT to the terminal's foreground process
group (what Ctrl-C sends), a grace period, then SIGKILL to that group (never to the shell
itself); the shell is resynchronised with a fresh marker and answers the next command. A shell
that died (`exit`, a kill) is reported with its exit status on every later request.

Requests: {"op": "run", "n": int, "command": str, "timeout": float, "cap": int,
"interactive": bool, "expect": [str]}; {"op": "ping"}; {"op": "close"}. Answers: {"ok": true,
"output": str, "exit_code": int | null, "timed_out": bool, "truncated": bool, "matched": str |
null} or {"ok": false, "dead": str} (the shell is gone) or {"ok": false, "error": str}.
"""

import errno
import json
import os
import pty
import secrets
import select
import shlex
import signal
import socket
import sys
import termios
import time

SOCKET_DIR = "/tmp/.tangram-sessions"
GRACE_S = 1.0  # after SIGINT, before SIGKILL of the foreground group
RESYNC_S = 5.0  # how long a resynchronising marker may take
PROGRAM_GRACE_S = 10.0  # an interrupted interactive program's way back to its prompt
POLL_S = 0.1  # how often a wait with no output looks whether the shell exited
MAX_REQUEST = 16 << 20  # bytes of one request line
# the shell prints a marker: the session's token, the request's number and `$?`
PRINTF = "printf '\\036%s:%d:%%s\\036' \"$?\""


class Shell:
    def __init__(self, name, bash):
        self.token = secrets.token_hex(8)
        self.prompt = (f"\x1e{self.token}:P\x1e").encode()  # PS1: the shell is back
        self.script = os.path.join(SOCKET_DIR, name + ".cmd")
        pid, fd = pty.fork()
        if pid == 0:  # the child: bash on the terminal's slave side, or exit 127
            try:
                self._exec(bash)
            finally:
                os._exit(127)  # never back into the host's code
        self.pid, self.fd = pid, fd
        self.dead = None
        self.pending = b""
        self.n = 0
        self._send(b"unset HISTFILE; set +o history 2>/dev/null\n")
        self._wait(self._sync(), 10.0, 1 << 16)
        self._settle()

    def _exec(self, bash):
        # the typed line is not output. Set here, before bash starts: bash keeps the
        # terminal's settings as it found them and restores them after a job killed by a
        # signal, so settings changed once it runs would be undone by an interrupt
        attrs = termios.tcgetattr(0)
        attrs[3] &= ~(termios.ECHO | termios.ECHONL)
        termios.tcsetattr(0, termios.TCSANOW, attrs)
        os.environ["PS1"] = self.prompt.decode()
        os.environ["PS2"] = ""
        os.environ.pop("PROMPT_COMMAND", None)
        os.environ.pop("HISTFILE", None)
        os.execvp(bash, [bash, "--noprofile", "--norc", "--noediting", "-i"])

    def _marker(self, n):
        return f"\x1e{self.token}:{n}:".encode()

    def _sync(self):
        """Ask the shell for a numbered marker carrying `$?`; returns its number."""
        self.n += 1
        self._send(f"{PRINTF % (self.token, self.n)}\n".encode())
        return self.n

    def _send(self, data):
        view = memoryview(data)
        while view:
            try:
                sent = os.write(self.fd, view)
            except InterruptedError:
                continue
            view = view[sent:]

    def _read(self, timeout):
        """Terminal output within `timeout` seconds (b"" when none); None once it closed."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return b""
        try:
            return os.read(self.fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EIO:  # the shell and everything on its terminal are gone
                return None
            raise

    def _wait(self, n, timeout, cap, expect=(), back=False):
        """Read until the marker of request `n` (None: none), one of the `expect` strings or,
        with `back`, the shell's prompt; or the deadline. Returns a dict: `out` (the first
        `cap` bytes of output before what ended the wait, prompts left out), `code` (the
        marker's exit code), `matched` (an expect string, or "prompt"), `timed_out`,
        `truncated`, `closed` (the terminal closed: the shell is gone)."""
        marker = self._marker(n) if n is not None else None
        wants = [e.encode() for e in expect]
        deadline = time.monotonic() + timeout
        data = bytearray(self.pending)  # output so far: the head within `cap`, plus the tail
        self.pending = b""
        total = len(data)
        window = 8192
        result = {"code": None, "matched": None, "timed_out": False, "closed": False}
        while True:
            found = self._find(data, marker, wants, back)
            if found is not None:
                at, after, result["code"], result["matched"] = found
                self.pending = bytes(data[after:])
                return self._output(data, at, total - (len(data) - at), cap, result)
            left = deadline - time.monotonic()
            if left <= 0:
                result["timed_out"] = True
                return self._output(data, len(data), total, cap, result)
            chunk = self._read(min(left, POLL_S))
            if chunk == b"" and self.reaped():  # it exited (a background job may hold the
                chunk = None  # terminal open, so its close is not the sign)
            if chunk is None:
                result["closed"] = True
                return self._output(data, len(data), total, cap, result)
            data += chunk
            total += len(chunk)
            if len(data) > cap + 2 * window:  # drop the middle: the head and the tail stay
                del data[cap : len(data) - window]

    def _find(self, data, marker, wants, back):
        """(where it starts, where it ends, exit code, matched) of what ends a wait in
        `data`, or None."""
        if marker is not None:
            at = data.find(marker)
            if at >= 0:
                end = data.find(b"\x1e", at + len(marker))
                if end >= 0:
                    return at, end + 1, _int(bytes(data[at + len(marker) : end])), None
        for want in wants:
            at = data.find(want)
            if at >= 0:
                return at, at + len(want), None, want.decode()
        if back:
            at = data.find(self.prompt)
            if at >= 0:
                return at, at + len(self.prompt), None, "prompt"
        return None

    def _output(self, data, at, before, cap, result):
        """The output before `at` (of `before` bytes in all), at most `cap` bytes of it, the
        shell's prompts left out."""
        out = bytes(data[: min(at, cap)]).replace(self.prompt, b"")
        result["out"] = out
        result["truncated"] = before > cap
        return result

    def run(self, req):
        if self.dead is not None:
            return {"ok": False, "dead": self.dead}
        timeout = float(req.get("timeout", 60))
        cap = int(req.get("cap", 1 << 20))
        expect = [e for e in req.get("expect") or [] if isinstance(e, str) and e]
        if req.get("interactive"):  # typed into the program that holds the terminal
            text = req["command"]
            self._send(text.encode() + (b"" if text.endswith("\n") else b"\n"))
            r = self._wait(None, timeout, cap, expect, back=True)
            if r["timed_out"]:  # Ctrl-C for the program: it may recover to its own prompt
                r = self._interrupt_program(r, cap, expect)
            if r["matched"] == "prompt" and not r["closed"]:  # back in the shell: its status
                code = self._wait(self._sync(), RESYNC_S, cap)
                r["code"] = code["code"]
                self._settle()
            if r.get("recovered"):
                return self._answer(r, r["out"])
        else:
            with open(self.script, "w") as f:
                for key, value in (req.get("variables") or {}).items():  # this command's grant
                    if key.isidentifier():
                        f.write(f"export {key}={shlex.quote(str(value))}\n")
                f.write(req["command"])
                f.write("\n")
            self.n += 1
            line = f". {self.script}; {PRINTF % (self.token, self.n)}\n"
            self._send(line.encode())
            r = self._wait(self.n, timeout, cap, expect)
            if r["code"] is not None:
                self._settle()
        out = r["out"]
        if r["closed"]:
            return dict(self._died(), output=_text(out))
        if r["timed_out"]:
            out += self._interrupt(cap)
            if self.dead is not None:
                return {"ok": False, "dead": self.dead, "output": _text(out)}
        return self._answer(r, out)

    def _answer(self, r, out):
        return {
            "ok": True,
            "output": _text(out),
            "exit_code": r["code"],
            "timed_out": r["timed_out"],
            "truncated": r["truncated"],
            "matched": r["matched"],
        }

    def _interrupt_program(self, r, cap, expect):
        """An interactive request past its timeout: SIGINT to the program holding the
        terminal; where it comes back to one of its prompts (or exits to the shell) within
        `PROGRAM_GRACE_S`, the request ends there, timed out, the program alive; else the
        shell's interrupt follows (`_interrupt`)."""
        group = _foreground(self.fd)
        if group is None or group <= 0 or group == os.getpgid(self.pid):
            return r
        _signal_group(group, signal.SIGINT)
        more = self._wait(None, PROGRAM_GRACE_S, cap, expect, back=True)
        if more["timed_out"] or more["closed"]:
            more["out"] = r["out"] + more["out"]
            return more
        more.update(out=r["out"] + more["out"], timed_out=True, recovered=True)
        return more

    def _settle(self):
        """Read through the prompt the shell prints after a marker, so the next request
        starts on a quiet terminal."""
        r = self._wait(None, RESYNC_S, 1 << 16, back=True)
        if r["closed"]:
            self._died()

    def _interrupt(self, cap):
        """SIGINT to the terminal's foreground group (Ctrl-C), then SIGKILL to it after the
        grace (never to the shell itself); the shell is resynchronised with a fresh marker."""
        group = _foreground(self.fd)
        if group is not None and group > 0:
            _signal_group(group, signal.SIGINT)
        r = self._wait(self._sync(), GRACE_S, cap)
        if r["closed"]:
            self._died()
            return r["out"]
        if not r["timed_out"]:
            self._settle()
            return r["out"]
        group = _foreground(self.fd)
        if group is not None and group > 0 and group != os.getpgid(self.pid):
            _signal_group(group, signal.SIGKILL)
        again = self._wait(self._sync(), RESYNC_S, cap)
        if again["closed"]:
            self._died()
        elif again["timed_out"]:
            self.kill()
            self.dead = "the shell did not come back after its command was interrupted"
        else:
            self._settle()
        return r["out"] + again["out"]

    def reaped(self):
        """Whether the shell has exited (then `dead` says how)."""
        if self.dead is not None:
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.dead = "the shell is gone"
            return True
        if pid:
            self.dead = _how(status)
            return True
        return False

    def _died(self):
        if self.dead is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.dead = _how(status)
            except ChildProcessError:
                self.dead = "the shell is gone"
        return {"ok": False, "dead": self.dead}

    def kill(self):
        try:
            os.killpg(os.getpgid(self.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _how(status):
    if os.WIFEXITED(status):
        return f"the shell exited with code {os.WEXITSTATUS(status)}"
    sig = os.WTERMSIG(status)
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = str(sig)
    return f"the shell was killed by {name}"


def _foreground(fd):
    try:
        return os.tcgetpgrp(fd)
    except OSError:
        return None


def _signal_group(group, sig):
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _int(raw):
    try:
        return int(raw)
    except ValueError:
        return None


def _text(raw):
    return raw.decode("utf-8", "replace").replace("\r\n", "\n")


def _serve(shell, listener):
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30.0)
            data = b""
            try:
                while not data.endswith(b"\n") and len(data) <= MAX_REQUEST:
                    part = conn.recv(65536)
                    if not part:
                        break
                    data += part
                req = json.loads(data.decode())
            except (OSError, ValueError):
                continue
            op = req.get("op")
            conn.settimeout(None)
            if op == "close":
                shell.kill()
                _answer(conn, {"ok": True})
                return
            if op == "ping":
                shell.reaped()
                answer = {"ok": shell.dead is None, "dead": shell.dead}
            elif op == "run":
                try:
                    answer = shell.run(req)
                except (OSError, KeyError, TypeError, ValueError) as exc:
                    answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            else:
                answer = {"ok": False, "error": f"unknown op {op!r}"}
            _answer(conn, answer)


def _answer(conn, answer):
    try:
        conn.sendall(json.dumps(answer).encode() + b"\n")
    except OSError:
        pass


def main(argv):
    name, bash = argv[1], argv[2] if len(argv) > 2 else "bash"
    os.makedirs(SOCKET_DIR, mode=0o700, exist_ok=True)
    path = os.path.join(SOCKET_DIR, name + ".sock")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    shell = Shell(name, bash)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(8)
    os.rename(path + ".new", path)  # ready: the server waits for this name
    _serve(shell, listener)


if __name__ == "__main__":
    main(sys.argv)
