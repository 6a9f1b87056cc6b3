"""Starting a bwrap sandbox: the trial one that `BwrapBackend.probe` runs, and the holder's
argument list, payload and process (`BwrapBackend._spawn_holder`). Split from `bwrap` by job;
see it for what the sandbox is."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from managers.cpu import seccomp
from managers.cpu.backends import spawner as fast
from managers.cpu.backends.bwrap_parts import (
    HOLDER_LAUNCHER,
    INSIDE_SUPPORT,
    INSIDE_WORK,
    ISOLATE,
    _drop_to,
    _system_binds,
)
from managers.cpu.backends.cgroup import CgroupBackend
from managers.cpu.grant import SAFE_PATH
from managers.cpu.pool import Environment
from managers.cpu.uids import DEFAULT_UID_BASE

IDLE_CAPS = ("--cap-drop", "ALL")  # the idle holder's: none


def probe_sandbox() -> str | None:
    """Why no bwrap sandbox can run here (None where one can): the cgroup backend's probe, the
    seccomp filter, bwrap and setpriv, and a trial sandbox that drops to a sandbox uid."""
    why = CgroupBackend.probe() or seccomp.unavailable()
    if why is not None:
        return why
    missing = [t for t in ("bwrap", "setpriv") if shutil.which(t) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not found: install bubblewrap (Debian: "
            f"`apt-get install bubblewrap`; setpriv is in util-linux)"
        )
    trial = [
        "bwrap",
        *ISOLATE,
        "--unshare-net",
        *_system_binds(()),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        *_drop_to(DEFAULT_UID_BASE),
        "/bin/true",
    ]
    try:
        done = subprocess.run(trial, capture_output=True, timeout=10, cwd="/", env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start a sandbox ({exc})"
    if done.returncode != 0:
        return (
            f"bwrap cannot create a sandbox here ({done.stderr.decode().strip()}): it "
            f"needs root with CAP_SYS_ADMIN (mount and PID namespaces) and a setpriv "
            f"that knows --no-new-privs and --bounding-set (util-linux >= 2.33)"
        )
    return None


def spawner_payload(uid: int, socket_fd: int) -> tuple[tuple[str, ...], list[str]]:
    """The spawner holder's payload and capabilities: a script inside starts it, so the
    sandbox's init shows no host path."""
    payload = (
        "/bin/sh",
        f"{INSIDE_SUPPORT}/{HOLDER_LAUNCHER}",
        str(uid),
        str(socket_fd),
    )
    # only what setpriv needs to drop to the uid and clear every set, itself included
    caps = [
        "--cap-drop",
        "ALL",
        *(a for c in fast.SETPRIV_CAPS for a in ("--cap-add", c)),
    ]
    return payload, caps


def sandbox_args(
    env: Environment,
    caps: tuple[str, ...] | list[str],
    info_w: int,
    filter_fd: int,
    system: list[str],
    extra: list[str],
    support: Path,
) -> list[str]:
    """bwrap's arguments for an environment's holder (read from a descriptor: `--args`)."""
    return [
        *ISOLATE,
        *([] if env.network else ["--unshare-net"]),
        "--hostname",
        "tangram",
        "--die-with-parent",
        *caps,
        "--info-fd",
        str(info_w),
        "--seccomp",
        str(filter_fd),
        *(system if env.root is None else ["--bind", env.root, "/"]),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",  # private, charged to the env
        # an image's /tmp is its own layer's (bounded by its disk)
        *(["--perms", "1777", "--tmpfs", "/tmp"] if env.root is None else []),
        "--bind",
        env.workdir,
        INSIDE_WORK,
        "--perms",
        "0755",
        "--dir",
        "/opt",
        "--ro-bind",
        str(support),
        INSIDE_SUPPORT,
        *(extra if env.root is None else []),
        "--chdir",
        "/",
    ]


def popen_holder(argv: list[str], passed: tuple[int, ...]) -> subprocess.Popen:
    """Start the holder (`argv`: bwrap behind the cgroup join), passing it `passed`."""
    return subprocess.Popen(
        argv,
        cwd="/",
        env={"PATH": SAFE_PATH},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=passed,
        start_new_session=True,
    )
