"""The few host programs a sandbox with an image of its own needs to start and enter:
`setpriv` (drop to the environment's uid), `sh` and `sleep` (the idle holder), `tar` (the files
API's tar stream, run inside as the environment's user), with the host's
dynamic loader and the libraries they link, copied under the support folder (bound read-only at
`/opt/tangram`). They run through the host's loader (`ld.so --library-path ...`), so an image
needs none of them, nor a C library compatible with the host's. Nothing else of the host is
visible inside such a sandbox.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

PROGRAMS = ("setpriv", "sh", "sleep", "tar")
FOLDER = "host"  # under the support folder


def _closure(program: str) -> tuple[str, list[str]]:
    """The host path of `program`, its loader and the libraries it links (from ldd)."""
    path = shutil.which(program)
    if path is None:
        raise FileNotFoundError(f"{program} not found on the host")
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return os.path.realpath(path), re.findall(r"(/\S+\.so[.\d]*)", out)


def install(support: Path) -> None:
    """Copy the programs, their libraries and the loader into `support/host` (idempotent)."""
    folder = support / FOLDER
    if (folder / "ld.so").exists() and all((folder / p).exists() for p in PROGRAMS):
        return
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    loader = None
    for program in PROGRAMS:
        path, libs = _closure(program)
        shutil.copy2(path, folder / program)
        for lib in libs:
            name = os.path.basename(lib)
            if name.startswith("ld-linux") or name.startswith("ld64"):
                loader = lib
            else:
                shutil.copy2(os.path.realpath(lib), folder / "lib" / name)
    if loader is None:
        raise FileNotFoundError("the host's dynamic loader was not found (ldd)")
    shutil.copy2(os.path.realpath(loader), folder / "ld.so")
    for p in folder.rglob("*"):
        p.chmod(0o755)
    folder.chmod(0o755)


def run(inside: str, program: str) -> list[str]:
    """The argv prefix that runs the copied `program` inside the sandbox (`inside`: where the
    support folder is bound)."""
    return run_path(inside, f"{inside}/{FOLDER}/{program}")


def run_path(inside: str, path: str) -> list[str]:
    """The argv prefix that runs the host-built binary at `path` (inside the sandbox) through
    the copied loader and libraries (it may link only what `PROGRAMS` link: the C library)."""
    base = f"{inside}/{FOLDER}"
    return [f"{base}/ld.so", "--library-path", f"{base}/lib", path]
