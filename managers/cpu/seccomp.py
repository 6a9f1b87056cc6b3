"""The seccomp filter of every sandboxed command: what the kernel refuses to an environment.

Modelled on Docker's default profile, as a deny list over an otherwise open system call table
(the sandbox's namespaces, its own uid, no capabilities and `no_new_privs` already confine the
rest). Built with libseccomp (through `pyseccomp`, ctypes bindings of the system's
libseccomp2) into a compiled BPF program that bwrap loads with `--seccomp FD` for the holder and
a loader (`LOADER_C` built with the host's compiler, else `LOADER` in Python) loads before each
exec's command. Each refused call answers EPERM (clone3: ENOSYS, so
libc falls back to clone, whose flags the filter can read); a system call of another
architecture (i386 `int 0x80`, x32) kills the process, since the filter covers the native table
only.

Why each group is refused:

- keyrings (`add_key`, `keyctl`, `request_key`): the kernel's keyrings are per uid and global to
  the host, a channel between environments and servers outside every namespace;
- `mq_open`: POSIX message queues outlive their processes in the sandbox's IPC namespace, which
  a reset sandbox keeps (`backends.bwrap.reset`), and cannot be listed without a mount of
  their own to remove them (System V IPC objects can: the reset removes those);
- `io_uring_*`: a second system call interface that seccomp cannot see into, and a large
  share of recent kernel privilege escalations;
- `bpf`, `perf_event_open`, `userfaultfd`: kernel attack surface (verifier, perf), and
  `userfaultfd` makes kernel races easy to win;
- kernel modules, `kexec`, clock setting: host-wide state (the missing capabilities refuse them
  too; refused here as well so a kernel bug in a capability check is not enough);
- new namespaces and mounts (`unshare`, `clone`/`clone3` with any `CLONE_NEW*` flag, `setns`,
  `mount`, `umount2`, `pivot_root` and the new mount API): a user namespace would give the
  command capabilities over namespaces of its own, and with them the mount and network code of
  the kernel; the sandbox's own namespaces are made before the filter is loaded.

`ptrace` stays open: every environment has its own uid and PID namespace, so a command can
trace only its own processes (debuggers and `strace` keep working); tracing anything else (the
sandbox's init, another environment) fails on the kernel's own checks, and a test tries it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

from managers.cpu.native import build_c

BLOCKED: dict[str, str] = {
    "add_key": "keyrings are shared by uid across the host",
    "keyctl": "keyrings are shared by uid across the host",
    "request_key": "keyrings are shared by uid across the host",
    "mq_open": "POSIX message queues outlive their processes (a reset sandbox keeps its IPC "
    "namespace) and cannot be listed to remove them",
    "io_uring_setup": "a syscall interface seccomp cannot filter",
    "io_uring_enter": "a syscall interface seccomp cannot filter",
    "io_uring_register": "a syscall interface seccomp cannot filter",
    "bpf": "kernel attack surface (the BPF verifier)",
    "perf_event_open": "kernel attack surface, host-wide performance data",
    "userfaultfd": "makes kernel races easy to win",
    "init_module": "kernel modules",
    "finit_module": "kernel modules",
    "delete_module": "kernel modules",
    "kexec_load": "replacing the kernel",
    "kexec_file_load": "replacing the kernel",
    "clock_settime": "the host's clock",
    "clock_adjtime": "the host's clock",
    "settimeofday": "the host's clock",
    "unshare": "new namespaces (a user namespace gives capabilities over them)",
    "setns": "joining namespaces",
    "mount": "mounts belong to the sandbox's setup",
    "umount2": "mounts belong to the sandbox's setup",
    "pivot_root": "mounts belong to the sandbox's setup",
    "open_tree": "the new mount API",
    "move_mount": "the new mount API",
    "fsopen": "the new mount API",
    "fsconfig": "the new mount API",
    "fsmount": "the new mount API",
    "fspick": "the new mount API",
    "mount_setattr": "the new mount API",
}
CLONE_NEW = {  # clone(2) flags that make a namespace: refused like unshare
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
FILTER_NAME = "seccomp.bpf"
LOADER_NAME = "seccomp_exec.py"

# Run inside the sandbox after setpriv (no_new_privs is set, so no capability is needed):
# load the compiled filter, then run the command with its stdout and stderr through this
# process, which passes on the first CAP + 1 bytes of each and drops the rest: a flood of
# output is drained here, on the environment's cores and memory, not in the server. It ends
# when the command ends (leftover children holding its pipes do not keep it) and exits as the
# command did (the same code, or the same signal). The command gets no descriptor above 2: what
# the launcher passed on (nsenter's /proc/<holder> directory, a device sandbox's namespace) stays
# out of it. The standard library only, no site.
LOADER = '''\
"""tangram: load the seccomp filter argv[1]; run argv[3:], passing argv[2] + 1 bytes of output."""
import ctypes, os, select, signal, sys
prog = open(sys.argv[1], "rb").read()
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
libc = ctypes.CDLL(None, use_errno=True)
fprog = Fprog(len(prog) // 8, prog)
# seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog)
nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
if libc.syscall(nr, 1, 1, ctypes.byref(fprog)) != 0:
    sys.stderr.write("tangram: cannot load the seccomp filter (errno %d)\\n" % ctypes.get_errno())
    sys.exit(125)
cap, argv = int(sys.argv[2]), sys.argv[3:]
pipes = [os.pipe(), os.pipe()]
pid = os.fork()
if pid == 0:
    for target, (r, w) in zip((1, 2), pipes):
        os.dup2(w, target)
        os.close(r)
        os.close(w)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, ("%s: %s\\n" % (argv[0], exc.strerror)).encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
left = {}
for target, (r, w) in zip((1, 2), pipes):
    os.close(w)
    left[r] = [target, cap + 1]
done = os.pidfd_open(pid)
def copy(fd, block):
    os.set_blocking(fd, block)
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        target, room = left[fd]
        if room > 0:
            try:
                os.write(target, data[:room])
            except OSError:
                left[fd][1] = 0
            left[fd][1] = max(0, room - len(data))
        if block:
            return True
while True:
    ready, _, _ = select.select([*left, done], [], [])
    if done in ready:
        for fd in list(left):
            copy(fd, False)
        break
    for fd in ready:
        if not copy(fd, True):
            del left[fd]
            os.close(fd)
_, status = os.waitpid(pid, 0)
sys.stdout.flush()
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
sys.exit(os.waitstatus_to_exitcode(status))
'''


# The same loader in C (built once per server with the host's C compiler where there is one,
# `build_native`): an exec costs a fork and an exec instead of a Python start (~10 ms, far
# more on a loaded machine).
LOADER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sock_filter prog[4096];
static char buf[65536];
static long room[2];

static int load(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, prog, sizeof prog);
    close(fd);
    if (n <= 0 || n % 8) { errno = EINVAL; return -1; }
    struct sock_fprog f = { .len = (unsigned short)(n / 8), .filter = prog };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &f);
}

static void forward(int i, ssize_t n) {  /* pass on what is left of the cap, drop the rest */
    ssize_t w = n < room[i] ? n : room[i], done = 0;
    while (done < w) {
        ssize_t k = write(i + 1, buf + done, (size_t)(w - done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { room[i] = 0; return; }
        done += k;
    }
    room[i] -= w;
}

int main(int argc, char **argv) {
    if (argc < 4) { fputs("usage: seccomp_exec FILTER CAP COMMAND...\n", stderr); return 125; }
    if (load(argv[1])) {
        fprintf(stderr, "tangram: cannot load the seccomp filter (errno %d)\n", errno);
        return 125;
    }
    room[0] = room[1] = atol(argv[2]) + 1;
    int p[2][2];
    if (pipe2(p[0], O_CLOEXEC) || pipe2(p[1], O_CLOEXEC)) return 125;
    pid_t pid = fork();
    if (pid < 0) return 125;
    if (pid == 0) {
        dup2(p[0][1], 1);
        dup2(p[1][1], 2);
        if (syscall(SYS_close_range, 3, ~0U, 0) != 0)  /* nothing above 2 reaches the command */
            for (long fd = 3, max = sysconf(_SC_OPEN_MAX); fd < max; fd++) close((int)fd);
        execvp(argv[3], argv + 3);
        int e = errno;
        dprintf(2, "%s: %s\n", argv[3], strerror(e));
        _exit(e == ENOENT ? 127 : 126);
    }
    close(p[0][1]);
    close(p[1][1]);
    int fds[2] = { p[0][0], p[1][0] }, open_[2] = { 1, 1 };
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    for (;;) {
        struct pollfd pf[3];
        int idx[3], k = 0;
        for (int i = 0; i < 2; i++)
            if (open_[i]) { pf[k].fd = fds[i]; pf[k].events = POLLIN; idx[k++] = i; }
        int pk = -1;
        if (pidfd >= 0) { pf[k].fd = pidfd; pf[k].events = POLLIN; pk = k++; }
        if (k == 0) break;
        if (poll(pf, (nfds_t)k, -1) < 0) { if (errno == EINTR) continue; break; }
        if (pk >= 0 && pf[pk].revents) {  /* it ended: take what is there, leave leftovers */
            for (int i = 0; i < 2; i++) {
                if (!open_[i]) continue;
                fcntl(fds[i], F_SETFL, O_NONBLOCK);
                ssize_t r;
                while ((r = read(fds[i], buf, sizeof buf)) > 0) forward(i, r);
            }
            break;
        }
        for (int j = 0; j < k; j++) {
            if (j == pk || !pf[j].revents) continue;
            int i = idx[j];
            ssize_t r = read(fds[i], buf, sizeof buf);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) { open_[i] = 0; close(fds[i]); } else forward(i, r);
        }
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        signal(sig, SIG_DFL);
        kill(getpid(), sig);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 125;
}
"""
NATIVE_NAME = "seccomp_exec"


def unavailable() -> str | None:
    """None when the filter can be built here, else why not and how to fix it."""
    try:
        import pyseccomp  # noqa: F401  (optional: ctypes bindings of libseccomp2)
    except (ImportError, OSError) as exc:
        return (
            f"cannot build the sandbox's seccomp filter ({exc}): install libseccomp2 "
            f"(Debian: `apt-get install libseccomp2`) and `pip install pyseccomp`"
        )
    if os.uname().machine not in ("x86_64", "aarch64"):
        return f"no seccomp loader for {os.uname().machine}"
    return None


def compile_filter() -> bytes:
    """The filter as a BPF program (what `--seccomp FD` and the loader take)."""
    import pyseccomp as sc  # optional dependency, see `unavailable`

    f = sc.SyscallFilter(sc.ALLOW)
    for name in BLOCKED:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, ValueError, RuntimeError):  # a call this kernel's table lacks
            continue
    for flag in CLONE_NEW.values():
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags behind a pointer: libc falls back
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def install(folder: Path) -> tuple[Path, bool]:
    """Write the compiled filter and its loaders into `folder` (the sandbox's read-only support
    folder); returns the filter's path and whether the native loader was built."""
    prog = compile_filter()
    path = folder / FILTER_NAME
    path.write_bytes(prog)
    (folder / LOADER_NAME).write_text(LOADER)
    for p in (path, folder / LOADER_NAME):
        p.chmod(0o644)
    return path, build_native(folder)


def build_native(folder: Path) -> bool:
    """Build `LOADER_C` into `folder/NATIVE_NAME` with the host's C compiler; False (and the
    Python loader is used) where there is none or it fails."""
    return build_c(folder, NATIVE_NAME, LOADER_C)


def docker_profile() -> str:
    """The same filter as a Docker seccomp profile (JSON, for `security_opt=["seccomp=..."]`):
    one rule set for both sandboxes. It replaces Docker's default allow list; what that list
    adds beyond this one is calls that need a capability, and the containers have none."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    rules = [
        {"names": sorted(BLOCKED), **eperm},
        *(
            {
                "names": ["clone"],
                **eperm,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
            for flag in CLONE_NEW.values()
        ),
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
    ]
    arch = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}.get(
        os.uname().machine, "SCMP_ARCH_NATIVE"
    )
    return json.dumps(
        {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules}
    )
