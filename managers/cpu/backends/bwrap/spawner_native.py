"""The resident spawner in C: the same program and protocol as `spawner_inside.py`, without a
Python start per sandbox (~10-15 ms of CPU each, the largest part of opening a sandbox).

Built once per server with the host's C compiler where there is one (as the native seccomp
loader is, `seccomp.build_native`); where there is none the Python spawner runs instead. The
protocol (see `spawner_inside`): `run <id> <k>` with the request memfd, stdout, stderr, the k
cgroup.procs files of the exec's slot and those of the holder's own; `kill <id>`; `drain <id>`
with a pipe to read and drop; answers `started <id> 0` and `exit <id> <code>` (negative: the
signal). Every descriptor it receives is close-on-exec (`MSG_CMSG_CLOEXEC`), the commands start
with an empty signal mask in a session of their own, and the process is non-dumpable.
"""

from __future__ import annotations

from pathlib import Path

from managers.cpu.native import build_c

NATIVE_NAME = "tangram_spawner"

SPAWNER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FDS 32
#define MAX_RUN 1024
#define MAX_DRAIN 2048
typedef struct { pid_t pid; char id[40]; } run_t;
typedef struct { int fd; char id[40]; } drain_t;
static run_t runs[MAX_RUN];
static drain_t drains[MAX_DRAIN];
static int nrun, ndrain, sock;
static char buf[65536];

static void say(const char *verb, const char *id, int code) {
    char m[128];
    int n = snprintf(m, sizeof m, "%s %s %d", verb, id, code);
    while (send(sock, m, (size_t)n, 0) < 0 && errno == EINTR) {}
}

static int find_run(const char *id) {
    for (int i = 0; i < nrun; i++) if (!strcmp(runs[i].id, id)) return i;
    return -1;
}

static void undrain(int i) {
    close(drains[i].fd);
    drains[i] = drains[--ndrain];
}

static char *read_all(int fd, size_t *len) {
    struct stat st;
    if (fstat(fd, &st) || st.st_size <= 0 || st.st_size > (64 << 20)) return NULL;
    char *data = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (data && got < (size_t)st.st_size) {
        ssize_t r = pread(fd, data + got, (size_t)st.st_size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { free(data); return NULL; }
        got += (size_t)r;
    }
    if (data) data[got] = 0;
    *len = got;
    return data;
}

static int resolve(const char *name, char **envp, char *out, size_t size) {
    if (strchr(name, '/')) { snprintf(out, size, "%s", name); return 0; }
    const char *path = "";
    for (char **e = envp; *e; e++) if (!strncmp(*e, "PATH=", 5)) path = *e + 5;
    for (const char *p = path;; ) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        struct stat st;
        snprintf(out, size, "%.*s/%s", (int)n, n ? p : ".", name);
        if (!stat(out, &st) && S_ISREG(st.st_mode) && !access(out, X_OK)) return 0;
        if (!end) break;
        p = end + 1;
    }
    errno = ENOENT;
    return -1;
}

/* An O_PATH descriptor (rootless) is reopened as this uid: cgroup v1 checks the opener's. */
static void move(int *fds, int n) {
    for (int i = 0; i < n; i++) {
        ssize_t w;
        while ((w = write(fds[i], "0", 1)) < 0 && errno == EINTR) {}
        if (w < 0 && errno == EBADF) {
            char path[64];
            snprintf(path, sizeof path, "/proc/self/fd/%d", fds[i]);
            int again = open(path, O_WRONLY | O_CLOEXEC);
            if (again >= 0) {
                while (write(again, "0", 1) < 0 && errno == EINTR) {}
                close(again);
            }
        }
    }
}

/* Start the request's command in the slot; returns its pid, -1 with errno set, or -2 when it
   was not found (said on `err`). */
static pid_t spawn(char *req, size_t len, int out, int err, int *slot, int k, int *home, int h) {
    char *items[4096];
    size_t n = 0;
    for (size_t i = 0; i < len && n < 4095; ) {
        items[n++] = req + i;
        i += strlen(req + i) + 1;
    }
    items[n] = NULL;
    long argc = n ? strtol(items[0], NULL, 10) : 0;
    if (argc < 1 || (size_t)argc >= n) { errno = EINVAL; return -1; }
    char **argv = calloc((size_t)argc + 1, sizeof(char *));
    if (!argv) return -1;
    memcpy(argv, items + 1, (size_t)argc * sizeof(char *));
    char **envp = items + 1 + argc;  /* up to the NULL after the last item */
    char exe[4096];
    if (resolve(argv[0], envp, exe, sizeof exe)) {
        const char *path = "";
        for (char **e = envp; *e; e++) if (!strncmp(*e, "PATH=", 5)) path = *e + 5;
        dprintf(err, "tangram spawner: cannot run the command: %s: not found on PATH %s\n",
                argv[0], path);
        free(argv);
        return -2;
    }
    sigset_t none;
    sigemptyset(&none);
    (void)home; (void)h;  /* the spawner never leaves its own slot: see below */
    /* vfork: no copy of this process. The child moves itself into the exec's slot and becomes
       the command there, confined from its first instruction; the spawner stays in its own
       slot, never pinned to the command's cores (moving itself in and out around a
       posix_spawn, it shared the command's one core until the command was preempted: its
       "started" came ~4 ms late under a python3 start). The spawner handles no signal
       (SIGCHLD is blocked, read from a signalfd), so none can run in the child. */
    pid_t pid = vfork();
    if (pid == 0) {
        move(slot, k);
        int dn = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (dn < 0 || dup2(dn, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0 || setsid() < 0
            || sigprocmask(SIG_SETMASK, &none, NULL))
            _exit(126);
        execve(exe, argv, envp);
        static const char m[] = "tangram spawner: cannot run the command (execve failed)\n";
        if (write(2, m, sizeof m - 1) < 0) {}
        _exit(errno == ENOENT ? 127 : 126);
    }
    free(argv);
    return pid;  /* -1 with errno set when vfork failed */
}

static void run(const char *id, int k, int *fds, int nfds) {
    size_t len = 0;
    char *req = nrun < MAX_RUN ? read_all(fds[0], &len) : NULL;
    pid_t pid = -1;
    if (req) pid = spawn(req, len, fds[1], fds[2], fds + 3, k, fds + 3 + k, nfds - 3 - k);
    else errno = nrun < MAX_RUN ? EINVAL : EAGAIN;
    if (pid < 0) {
        if (pid == -1)
            dprintf(fds[2], "tangram spawner: cannot run the command: %s\n", strerror(errno));
        say("exit", id, 127);
    } else {
        runs[nrun].pid = pid;
        snprintf(runs[nrun++].id, sizeof runs[0].id, "%s", id);
        say("started", id, 0);
    }
    free(req);
}

static void reap(void) {
    int st;
    pid_t pid;
    while (nrun && (pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; i < nrun; i++) {
            if (runs[i].pid != pid) continue;
            for (int d = ndrain - 1; d >= 0; d--)
                if (!strcmp(drains[d].id, runs[i].id)) undrain(d);
            say("exit", runs[i].id, WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
            runs[i] = runs[--nrun];
            break;
        }
    }
}

/* One message from the server; returns 0 when the server is gone. */
static int message(void) {
    char m[257], ctl[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct iovec io = { m, 256 };
    struct msghdr h = { .msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl,
                        .msg_controllen = sizeof ctl };
    ssize_t n = recvmsg(sock, &h, MSG_CMSG_CLOEXEC);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) return 0;
    m[n] = 0;
    int fds[MAX_FDS], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < MAX_FDS; i++)
                memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    char verb[16], id[40];
    int k = 0, words = sscanf(m, "%15s %39s %d", verb, id, &k);
    int keep = -1;
    if (words == 2 && !strcmp(verb, "kill")) {
        int i = find_run(id);
        if (i >= 0) { kill(-runs[i].pid, SIGKILL); kill(runs[i].pid, SIGKILL); }
    } else if (words == 2 && !strcmp(verb, "drain") && nfds == 1 && ndrain < MAX_DRAIN
               && find_run(id) >= 0) {
        fcntl(fds[0], F_SETFL, O_NONBLOCK);
        drains[ndrain].fd = fds[0];
        snprintf(drains[ndrain++].id, sizeof drains[0].id, "%s", id);
        keep = 0;
    } else if (words == 3 && !strcmp(verb, "run") && nfds >= 3 && k >= 0 && 3 + k <= nfds) {
        run(id, k, fds, nfds);
    }
    for (int i = 0; i < nfds; i++) if (i != keep) close(fds[i]);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) { fputs("usage: tangram_spawner SOCKET_FD WORKDIR\n", stderr); return 2; }
    sock = atoi(argv[1]);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) || chdir(argv[2])) {
        perror("tangram spawner");
        return 1;
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) { perror("tangram spawner: signalfd"); return 1; }
    if (write(1, "ready\n", 6) != 6) return 1;
    close(1);
    struct pollfd pf[2 + MAX_DRAIN];
    for (;;) {
        pf[0] = (struct pollfd){ .fd = sock, .events = POLLIN };
        pf[1] = (struct pollfd){ .fd = sfd, .events = POLLIN };
        int nd = ndrain;
        for (int i = 0; i < nd; i++)
            pf[2 + i] = (struct pollfd){ .fd = drains[i].fd, .events = POLLIN };
        if (poll(pf, (nfds_t)(2 + nd), -1) < 0) { if (errno == EINTR) continue; return 1; }
        for (int i = nd - 1; i >= 0; i--) {
            if (!pf[2 + i].revents || i >= ndrain || drains[i].fd != pf[2 + i].fd) continue;
            ssize_t r = read(drains[i].fd, buf, sizeof buf);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) undrain(i);
        }
        if (pf[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {}
        }
        reap();
        if (pf[0].revents && !message()) return 0;
    }
}
"""


def build(folder: Path) -> bool:
    """Build `SPAWNER_C` into `folder/NATIVE_NAME`; False where there is no C compiler or the
    build fails (the Python spawner is used then)."""
    return build_c(folder, NATIVE_NAME, SPAWNER_C)
