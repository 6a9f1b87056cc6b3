"""Run a bench's measurement as an unprivileged user, beside the root figures of the same run
(the rootless columns of `tangram bench exec` and `tangram bench sandboxfusion --latency`).

The user is `TANGRAM_ROOTLESS_USER`, else `tangram-rootless` (what `.ci/rootless.sh` makes);
it runs this Python where it may, else the system's Python of the same version with this one's
packages on its path. `why_not` says why no rootless figure can be taken here."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_USER = "tangram-rootless"


def user() -> str:
    return os.environ.get("TANGRAM_ROOTLESS_USER") or DEFAULT_USER


def _env(name: str, extra: str) -> list[str]:
    entry = pwd.getpwnam(name)
    path = os.pathsep.join(p for p in (str(REPO), extra) if p)
    return [
        "env",
        "-i",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        f"HOME={entry.pw_dir}",
        f"XDG_RUNTIME_DIR=/run/user/{entry.pw_uid}",
        "RAY_AUTH_MODE=disabled",
        "PYTHONDONTWRITEBYTECODE=1",
        f"PYTHONPATH={path}",
    ]


def command() -> list[str] | str:
    """The argv prefix that runs Python as the user with this repository, or why none."""
    if os.geteuid() != 0:
        return "not root: the rootless figure needs root to switch to the unprivileged user"
    name = user()
    try:
        pwd.getpwnam(name)
    except KeyError:
        return f"no user {name} (as root: `bash .ci/rootless.sh`)"
    if shutil.which("runuser") is None:
        return "runuser not found (util-linux)"
    tries = [([sys.executable], "")]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system:
        tries.append(([system, "-s"], sysconfig.get_paths()["purelib"]))
    for python, extra in tries:
        cmd = ["runuser", "-u", name, "--", *_env(name, extra), *python]
        probe = "import sys, managers; print(tuple(sys.version_info[:2]))"
        done = subprocess.run([*cmd, "-c", probe], capture_output=True, text=True, cwd=REPO)
        if done.returncode == 0 and done.stdout.strip() == str(tuple(sys.version_info[:2])):
            return cmd
    return f"user {name} cannot run this Python with the repository"


def run_json(argv: list[str], timeout: float = 900) -> object:
    """Run `python argv...` as the user; its last stdout line, parsed as JSON. Raises
    RuntimeError naming why where it cannot or fails."""
    cmd = command()
    if isinstance(cmd, str):
        raise RuntimeError(cmd)
    done = subprocess.run([*cmd, *argv], capture_output=True, text=True, cwd=REPO, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError((done.stderr or done.stdout).strip()[-600:] or f"exit {done.returncode}")
    return json.loads(lines[-1])
