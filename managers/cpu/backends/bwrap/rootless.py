"""The bwrap backend without root: what changes when the server is an ordinary user.

The sandbox is the same (the same bwrap arguments, namespaces, seccomp filter, spawner and uid
drop); what root gave it comes from elsewhere:

- the power to mount and to drop to another uid: each environment has a user namespace of its
  own (`managers.cpu.subids.make_userns`: its root is the server's user, its uid one of the
  user's subordinate uids, the same number inside and out), and bwrap runs as that namespace's
  root (`nsenter --user`), so it builds the sandbox exactly as it does as root; every exec
  entered from outside joins that user namespace first (`NAMESPACES`);
- cgroups: a subtree delegated to the user (`cgroup.fs.delegation`); the spawner moves a
  command into its slot by reopening the slot's cgroup.procs files itself (the server passes
  them as O_PATH descriptors, and the files are writable by the environment's uid: cgroup v1
  checks that the opener's uid is the moved process's), so nothing of the server's authority is
  used for it;
- the files of an environment (its work folder is mode 0700, owned by its uid): the server
  reaches them from a child that joined the environment's user namespace
  (`subids.in_userns`), for the files API, the work folder's set-up and removal, and resets.

What is not there without root: the views that give the support folder, the server's Python and
each work folder a filesystem of their own (mounts on the host): the sandbox sees the server's
Python at its own path and its mount table names the host folders it binds. The host's uid
registry (/run/tangram) is root's: the uids are the user's subordinate range instead
(`subids.SubUidAllocator`).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from managers.cpu import subids
from managers.cpu.backends.bwrap.layout import trial_argv
from managers.cpu.backends.cgroup import fs
from managers.cpu.removal import remove_tree
from tangram.errors import BackendUnavailable

NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


# what a rootless sandbox lacks beside root's, said at start (WARNING) and in docs/rootless.md
LOST = (
    "its mount table names the host folders it binds (the views that hide them are mounts on "
    "the host); an image's overlay is mounted inside the sandbox, so the files API reaches "
    "its work folder only, and disk_mb bounds, forks and snapshots need root (overlayfs on "
    "loop devices, idmapped layers) and are refused naming it; its uids are the user's "
    "subordinate range, reused once the range went round (root's are never reused before a "
    "reboot)"
)


def rootless() -> bool:
    return os.geteuid() != 0


def probe() -> str | None:
    """Why no rootless sandbox can run here (None where one can): a subordinate range and its
    helpers, a delegated cgroup subtree, bwrap and setpriv, and a trial sandbox that drops to a
    subordinate uid inside a user namespace of its own."""
    try:
        ids = subids.subids()
        fs.detect("probe")
    except BackendUnavailable as exc:
        return str(exc)
    missing = [t for t in ("bwrap", "setpriv", "nsenter", "unshare") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found: install bubblewrap and util-linux"
    uid = ids.uid + ids.count - 1  # the range's last: the allocator hands it out last
    try:
        ns = subids.make_userns(uid, ids.gid + ids.count - 1)
    except BackendUnavailable as exc:
        return str(exc)
    try:
        return _trial(ns, uid)
    finally:
        os.close(ns)


def _trial(ns: int, uid: int) -> str | None:
    trial = [*holder_prefix(ns), *trial_argv(uid)]
    try:
        done = subprocess.run(
            trial, capture_output=True, timeout=10, cwd="/", env={}, pass_fds=(ns,)
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start a sandbox in a user namespace ({exc})"
    if done.returncode != 0:
        return (
            f"bwrap cannot create a sandbox in a user namespace here "
            f"({done.stderr.decode().strip()}): the kernel must allow mount and PID namespaces "
            f"inside an unprivileged user namespace"
        )
    return None


def holder_prefix(ns: int) -> tuple[str, ...]:
    """What runs bwrap as the root of the environment's user namespace (the descriptor `ns`,
    passed to it, then closed: the sandbox holds no descriptor of its namespace)."""
    return (
        "nsenter",
        f"--user=/proc/self/fd/{ns}",
        "--",
        "/bin/sh",
        "-c",
        f'exec "$@" {ns}<&-',
        "sh",
    )


def image_dirs(workdir: str) -> dict[str, str]:
    """(Rootless, with an image) the folders of the environment's overlay, beside its work
    folder: the writable layer, overlayfs's work folder, the mount point."""
    top = f"{workdir}-image"
    return {"top": top, **{n: os.path.join(top, n) for n in ("upper", "work", "merged")}}


def make_image_dirs(workdir: str, lower: str) -> None:
    """Make `image_dirs`; the writable layer's top is the sandbox's `/`, which its users must
    be able to enter (mode 0755, owned by the namespace's root: the server's user)."""
    for c in (",", ":", "\n"):
        if c in lower or c in workdir:
            raise BackendUnavailable(f"an overlay cannot name {lower!r} or {workdir!r} ({c!r})")
    dirs = image_dirs(workdir)
    for name in ("top", "upper", "work", "merged"):
        os.makedirs(dirs[name], mode=0o700, exist_ok=True)
    os.chmod(dirs["upper"], 0o755)
    os.chmod(dirs["top"], 0o711)


def overlay_prefix(lower: str, workdir: str) -> tuple[str, ...]:
    """What mounts the image's overlay (in a mount namespace of its own, as the root of the
    environment's user namespace) before bwrap starts (`sandbox_mounts` binds it as /)."""
    d = image_dirs(workdir)
    mount = 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" && shift 4'
    return (
        "unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", f'{mount} && exec "$@"', "sh",
        lower, d["upper"], d["work"], d["merged"],
    )  # fmt: skip


def make_workdir(path: str, uid: int) -> None:
    """(In the environment's user namespace) hand the work folder to `uid`, mode 0700."""
    os.chown(path, uid, uid)
    os.chmod(path, 0o700)


def remove_workdir(path: str) -> list[str]:
    """(In the environment's user namespace) remove the work folder; what is left."""
    return remove_tree(path)


def open_to_uid(procs: tuple[os.PathLike | str, ...]) -> None:
    """Let the environment's uid open a slot's cgroup.procs files (`spawner` reopens them: on
    v1 the kernel checks that the opener's uid is the moved process's)."""
    for p in procs:
        os.chmod(p, 0o666)
