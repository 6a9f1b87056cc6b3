"""What a bwrap sandbox sees of the server's own folders, each a filesystem of its own on the
host (`managers.cpu.mounts`), so that its mount table (`/proc/self/mountinfo`, `mounts`,
`mountstats`) names no host path, no state folder and no server PID:

- the support folder (`/opt/tangram` inside): a tmpfs of `SUPPORT_MB` at most (what it holds
  takes ~4 MiB), mounted where the folder is;
- a plain environment's work folder (`/sandbox`): an overlay mounted at the folder itself, with
  no lower files and its files in `upper` below the mount point (hidden by it), so the server's
  reads, writes, resets and removals go through the same mount as the sandbox's. (With a disk
  bound or an image the work folder is an overlay already: `managers.cpu.layers`.)
- the server's Python, where it lives outside /usr: read-only overlays in a folder of the
  server's, bound in plain environments only at `/opt/tangram/python` (its virtual
  environment) and `/opt/tangram/python-base` (its installation), with `python-fix` on top of
  the environment (a `pyvenv.cfg` whose `home` is the installation's new place, the
  interpreter linked there, and `bin/python3`, which sets the library path before it starts
  it: an interpreter built with a shared libpython finds it by an absolute path otherwise).
  Commands learn where it is from `TANGRAM_PYTHON`; `sys.executable`'s own path is not there.
  Where the kernel refuses the overlays the backend binds the Python at its own paths, as
  before (and says so in its log).

The Python's own files still say where it was built (its `sysconfig` data, the scripts'
`#!` lines): that is file content, not /proc.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from managers.cpu import mounts

log = logging.getLogger(__name__)
SUPPORT_MB = 64
SYSTEM = ("/usr/", "/etc/")  # the system's folders, which every sandbox sees as they are
WORK_LAYERS = ("lower", "upper", "work")  # below a plain work folder's mount point


def own_support(folder: Path) -> None:
    """The support folder as a tmpfs of its own (made, then mounted on)."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not os.path.ismount(folder):
        mounts.mount(
            "tmpfs",
            folder,
            "tmpfs",
            mounts.MS_NOSUID | mounts.MS_NODEV,
            f"mode=0755,size={SUPPORT_MB}m",
        )


def own_workdir(folder: str) -> None:
    """A plain work folder as an overlay of its own, mounted at the folder; its owner and
    mode are set through it afterwards (`Backend._make_workdir`)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for name in WORK_LAYERS:
        os.makedirs(os.path.join(folder, name), mode=0o700, exist_ok=True)
    lower, upper, work = (os.path.join(folder, n) for n in WORK_LAYERS)
    mounts.overlay(folder, [lower], upper, work)


def drop_workdir(folder: str) -> None:
    """Unmount a work folder's overlay (its files, below the mount point, are then removed
    with the folder)."""
    mounts.detach(folder)


def _outside_system(path: str) -> bool:
    return path not in ("/", "/usr") and not path.startswith(SYSTEM)


def install_python(folder: Path, support: Path, inside: str) -> tuple[str, list[str]] | None:
    """Mount read-only views of the server's Python in `folder` (made here: the server's own,
    removed with `mounts.remove_folder`), with their mount points in `support` (seen as
    `inside`); returns the command that runs it inside and bwrap's arguments that bind the
    views there (a plain environment's: an image's root has none of the host's programs).
    (`sys.executable`, []) for the system's own Python, visible as it is; None where the
    overlays could not be mounted (the caller binds it at its own paths instead)."""
    prefix, base = os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)
    if not _outside_system(prefix):
        return sys.executable, []
    venv, moved = prefix != base, _outside_system(base)
    views = {"python": [prefix]}
    if venv and moved:
        views["python-base"] = [base, folder / "python-base-fix"]  # (two lowers, no upper)
    view = f"{inside}/python"
    base_inside = (f"{inside}/python-base" if venv else view) if moved else base
    try:
        folder.mkdir(mode=0o700)
        views["python"].insert(0, _python_fix(folder, prefix, view, base_inside, venv, moved))
        for name, lowers in views.items():
            for d in (folder / name, folder / f"{name}-fix", support / name):
                d.mkdir(mode=0o755, exist_ok=True)
            mounts.overlay(folder / name, lowers)
    except OSError as exc:
        left = mounts.remove_folder(folder)
        log.warning(
            "bwrap: the server's Python is bound at its own paths, which its sandboxes see in "
            "/proc/self/mountinfo (%s%s)",
            exc,
            f"; left: {'; '.join(left)}" if left else "",
        )
        return None
    binds = [a for name in views for a in ("--ro-bind", str(folder / name), f"{inside}/{name}")]
    return f"{view}/bin/python3", binds


def _python_fix(folder: Path, prefix: str, view: str, base: str, venv: bool, moved: bool) -> Path:
    """The layer over the Python's own files (see the module docstring): `view` is where its
    virtual environment (or installation) is inside, `base` where its installation is."""
    fix = folder / "python-fix"
    (fix / "bin").mkdir(mode=0o755, parents=True)
    binary = os.path.basename(os.path.realpath(sys.executable))  # python3.X, the real one
    if venv:
        (fix / "bin" / binary).symlink_to(f"{base}/bin/{binary}")
        system = "false"
        cfg = Path(prefix) / "pyvenv.cfg"
        for line in cfg.read_text().splitlines() if cfg.exists() else ():
            key, _, value = line.partition("=")
            if key.strip() == "include-system-site-packages":
                system = value.strip()
        (fix / "pyvenv.cfg").write_text(
            f"home = {base}/bin\ninclude-system-site-packages = {system}\n"
            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
        )
    path = f"export LD_LIBRARY_PATH={base}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
    start = fix / "bin" / "python3"
    start.write_text(f'#!/bin/sh\n{path if moved else ""}exec {view}/bin/{binary} "$@"\n')
    start.chmod(0o755)
    return fix
