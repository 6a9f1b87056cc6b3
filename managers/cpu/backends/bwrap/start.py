"""Starting a bwrap sandbox: the trial one that `BwrapBackend.probe` runs, the holder's
argument list, payload and process (`BwrapSandbox._spawn_holder`), and the device sandbox of an
exec granted GPUs (`device_sandbox_args`). Split from `bwrap` by job; see it for what the
sandbox is."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from managers.cpu import seccomp
from managers.cpu.backends.bwrap import spawner as fast
from managers.cpu.backends.bwrap.layout import (
    HOLDER_LAUNCHER,
    INSIDE_SUPPORT,
    INSIDE_WORK,
    ISOLATE,
    image_root,
    trial_argv,
)
from managers.cpu.backends.bwrap.rootless import image_dirs
from managers.cpu.backends.cgroup.backend import CgroupBackend
from managers.cpu.environments import Environment
from managers.cpu.grant import SAFE_PATH
from managers.cpu.uids import DEFAULT_UID_BASE

IDLE_CAPS = ("--cap-drop", "ALL")  # the idle holder's: none
# the NVIDIA driver's nodes every CUDA process opens besides its GPUs', bound where they exist
GPU_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# the holder's namespaces a device sandbox joins through nsenter (its PID namespace: bwrap's
# --pidns, so that its /proc is that namespace's; its mounts: none, it has its own /dev)
DEVICE_NAMESPACES = ("net", "ipc", "uts", "cgroup")


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
    try:
        done = subprocess.run(
            trial_argv(DEFAULT_UID_BASE), capture_output=True, timeout=10, cwd="/", env={}
        )
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
    cgroup_made: bool = False,
) -> list[str]:
    """bwrap's arguments for an environment's holder (read from a descriptor: `--args`);
    `cgroup_made`: it starts in a cgroup namespace of its own already (`rooted_at_env`)."""
    return [
        *ISOLATE,
        *([] if cgroup_made else ["--unshare-cgroup"]),
        *([] if env.network else ["--unshare-net"]),
        "--hostname",
        "tangram",
        "--die-with-parent",
        *caps,
        "--info-fd",
        str(info_w),
        "--seccomp",
        str(filter_fd),
        *sandbox_mounts(env, system, extra, support),
        "--chdir",
        "/",
    ]


def sandbox_mounts(
    env: Environment, system: list[str], extra: list[str], support: Path
) -> list[str]:
    """What an environment's sandbox sees (its holder's, and each device sandbox's). Rootless
    with an image, the overlay is mounted before bwrap starts (`rootless.overlay_prefix`) at
    the folder `rootless.image_dirs` names, in a mount namespace of the sandbox's own."""
    if env.root is not None:
        root = ["--bind", env.root, "/"]
    elif env.lower is not None:
        root = ["--bind", image_dirs(env.workdir)["merged"], "/"]
    else:
        root = system
    return [
        *root,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",  # private, charged to the env
        # an image's /tmp is its own layer's (bounded by its disk)
        *(["--perms", "1777", "--tmpfs", "/tmp"] if env.root is None else []),  # (rootless: own)
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
        *(extra if image_root(env) is None else []),
    ]


def gpu_device_nodes(device_dir: str, gpus: tuple[int, ...]) -> tuple[list[str], list[str]]:
    """(the device nodes of `device_dir` an exec granted `gpus` gets: `nvidia<i>` of each
    granted GPU and the control nodes that exist; the granted GPUs' nodes that are missing)."""
    wanted = [f"nvidia{i}" for i in gpus]
    missing = [n for n in wanted if not os.path.exists(os.path.join(device_dir, n))]
    control = [n for n in GPU_CONTROL_DEVICES if os.path.exists(os.path.join(device_dir, n))]
    return [*wanted, *control], missing


def device_sandbox_args(
    env: Environment,
    system: list[str],
    extra: list[str],
    support: Path,
    device_dir: str,
    devices: list[str],
    pidns: int,
) -> list[str]:
    """bwrap's arguments for one exec granted GPUs: the environment's files as its holder sees
    them (`sandbox_mounts`) in a mount namespace of its own, whose /dev also holds `devices`
    (`--dev-bind`, so they stay usable); run in the holder's PID namespace (`pidns`, a
    descriptor of it, which bwrap closes) and its other namespaces (`DEVICE_NAMESPACES`,
    entered by nsenter), so it shares the environment's processes, network and IPC. Its /tmp
    and /dev/shm are its own (an image's /tmp is the image's)."""
    binds = [a for d in devices for a in ("--dev-bind", os.path.join(device_dir, d), f"/dev/{d}")]
    return [
        "--pidns",
        str(pidns),
        "--die-with-parent",
        *sandbox_mounts(env, system, extra, support),
        *binds,
        "--chdir",
        INSIDE_WORK,
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
