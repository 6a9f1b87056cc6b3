"""The whole sandbox without root. As root, this module makes an unprivileged user with a
subordinate id range and a delegated cgroup subtree (`.ci/rootless.sh`), then, as that user
(`runuser`): the sandbox, escape, /run_code, session and capacity suites pass on the rootless
bwrap backend; the README's demo runs sandboxed; two environments run as different uids, and no
channel between them is open (signals, /proc, shared memory, System V IPC, abstract unix
sockets, files). Skips naming why where the user, its Python or its sandbox cannot be set up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / ".ci" / "rootless.sh"
# the suites run as the user, and what each leaves out (root's own mechanisms, named)
SUITES = {
    "test_sandbox_escapes.py": "",
    "test_spawner.py": "",
    # the quick reset on the event loop is root's (it reads the work folder directly)
    "test_sandbox_reset.py": "not small_leftover_is_reset_on_the_loop",
    "test_sandboxfusion.py": "",
    "test_sessions.py": "not fork_carries",  # forks need layers (root: overlayfs on a loop)
    "test_capacity.py": "",
}


def _user_env(user: str, home: str, extra_path: str) -> list[str]:
    uid = subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout.strip()
    return [
        "env",
        "-i",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        f"HOME={home}",
        f"XDG_RUNTIME_DIR=/run/user/{uid}",
        "RAY_AUTH_MODE=disabled",
        "PYTHONDONTWRITEBYTECODE=1",
        f"PYTHONPATH={os.pathsep.join(p for p in (str(REPO), extra_path) if p)}",
    ]


def as_user(setup: dict, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = ["runuser", "-u", setup["user"], "--", *setup["env"], *setup["python"], *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _python_for(user: str, home: str) -> tuple[list[str], str] | str:
    """(the Python the user runs with the server's packages, extra PYTHONPATH), or why none:
    this interpreter where the user may run it, else the system's of the same version with
    this one's site-packages on its path."""
    site = sysconfig.get_paths()["purelib"]
    tries = [([sys.executable], "")]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system:
        tries.append(([system, "-s"], site))
    why = ""
    for python, extra in tries:
        cmd = ["runuser", "-u", user, "--", *_user_env(user, home, extra), *python]
        probe = "import sys, managers, tangram; print(sys.version_info[:2])"
        done = subprocess.run([*cmd, "-c", probe], capture_output=True, text=True, cwd=REPO)
        if done.returncode == 0 and done.stdout.strip() == str(sys.version_info[:2]):
            return python, extra
        why += f"{python[0]}: {(done.stderr.strip().splitlines() or ['?'])[-1]}; "
    return f"user {user} cannot run this Python with the repository ({why.strip('; ')})"


@pytest.fixture(scope="module")
def setup() -> dict:
    if os.geteuid() != 0:
        pytest.skip("runs as root: it makes the unprivileged user (.ci/rootless.sh) first")
    if shutil.which("runuser") is None or shutil.which("bwrap") is None:
        pytest.skip("needs runuser (util-linux) and bwrap (bubblewrap)")
    made = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        pytest.skip(f".ci/rootless.sh could not set the user up: {made.stderr.strip()[-500:]}")
    user = made.stdout.strip().splitlines()[-1]
    home = os.path.expanduser(f"~{user}")
    found = _python_for(user, home)
    if isinstance(found, str):
        pytest.skip(found)
    python, extra = found
    s = {"user": user, "python": python, "env": _user_env(user, home, extra)}
    probe = "from managers.cpu.backends.bwrap import BwrapBackend as B; print(B.probe() or 'ok')"
    done = as_user(s, ["-c", probe], 120)
    if done.stdout.strip() != "ok":
        pytest.skip(f"the rootless sandbox cannot run here: {done.stdout}{done.stderr}"[-800:])
    return s


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_the_suite_passes_as_the_unprivileged_user(setup, suite):
    skip = [SUITES[suite]] if SUITES[suite] else []
    if setup["python"][0] != sys.executable and suite == "test_sandboxfusion.py":
        # the sandbox sees the server's Python without the packages put on its path
        skip.append("not jupyter")
    deselect = ["-k", " and ".join(skip)] if skip else []
    argv = ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = as_user(setup, [*argv, *deselect, f"tests/integration/{suite}"], 900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert " passed" in out, out[-2000:]
    # none skipped for want of the sandbox: those would pass without running rootless
    assert "bwrap backend unavailable" not in out and "needs root" not in out, out[-2000:]


def test_the_demo_runs_sandboxed_as_the_unprivileged_user(setup):
    done = as_user(setup, ["-m", "tangram.runtime.cli", "demo", "--trajectories", "2"], 600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Commands ran on the bwrap CPU backend" in " ".join(out.split()), out[-3000:]
    assert "does not isolate" not in out, out[-3000:]


def test_environments_have_their_own_uids_and_no_channel_between_them(setup):
    done = as_user(setup, [str(REPO / "tests/integration/rootless_channels.py")], 300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    a, b, mark = seen["a"], seen["b"], seen["mark"]
    assert "rootless" in seen["backend"], seen["backend"]
    assert "need root" in seen["lost"] and "mount table" in seen["lost"]  # (/v1/status too)
    # uids: two, neither the server's, both mapped from the user's subordinate range
    assert a["uid"] != b["uid"] and seen["server_uid"] not in (int(a["uid"]), int(b["uid"]))
    assert seen["a_workdir_owner"] == int(a["uid"]) and seen["a_workdir_mode"] == "0o700"
    # files: A's are in its work folder and /tmp; B reaches neither, nor the host path
    assert a["files"] == "ok" and b["files"].count("No such file") == 3, b["files"]
    # shared memory: A's POSIX object and System V segment are not B's to see
    assert mark in a["shm"] and mark not in b["shm"]
    assert a["sysv"].splitlines()[-1] == "1" and b["sysv"] == "0"
    # abstract unix socket: A connects to its own; B is refused (another network namespace)
    assert a["live"].startswith("connected") and b["connect"].startswith("refused")
    # processes: A's, alive on the host, are not in B's /proc; B's kill does not reach them
    assert seen["a_host_pids"] and b["proc"] == "end"
    assert b["kill"].count("refused") == len(seen["a_host_pids"])
    assert seen["a_alive_after"] == seen["a_host_pids"]
    assert int(b["pids"]) < 10  # its own few: its init, spawner, the command
    # a dead server's work folder (its environment's uid's files) is swept at start
    assert seen["dead_servers_folder_swept"]


def test_a_sif_opens_as_an_environments_root_as_the_unprivileged_user(setup):
    if shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None:
        pytest.skip("needs squashfs-tools (mksquashfs, unsquashfs)")
    state = Path(tempfile.mkdtemp(prefix="tangram-rootless-state."))  # (the user's to enter)
    shutil.chown(state, setup["user"])
    s = {**setup, "env": [*setup["env"], f"TANGRAM_STATE_DIR={state}"]}
    try:
        done = as_user(s, [str(REPO / "tests/integration/rootless_image.py")], 300)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["import"][0] == 0 and "from-sif sha256:" in seen["import"][1], seen["import"]
    status, out, err = seen["a"]
    assert status == "ok" and out.split()[:1] == ["from-a-sif"], (out, err)
    uid_a, note, made = out.split()[1:4]
    assert note == "hello" and made == "made"
    status, out, err = seen["b"]
    assert status != "ok" or "No such file" in out  # B sees neither A's file nor its /tmp
    assert out.split()[0] != uid_a and "own" not in out.split()[1:]
