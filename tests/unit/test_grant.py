"""The grant a command sees: its fixed environment, and the pytest plugin of elastic runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from managers.cpu.grant import PLUGIN, PLUGIN_SOURCE, SAFE_PATH, command_env, install_plugin
from managers.cpu.pytest_grant.tangram_pytest_grant import workers_to_add


def test_command_env_is_fixed_and_never_the_servers(monkeypatch):
    monkeypatch.setenv("TANGRAM_TOKEN", "secret")
    env = command_env("env-1", 3, "/work", elastic=False, plugin_dir="/opt/t")
    assert env == {
        "PATH": SAFE_PATH,
        "HOME": "/work",
        "LANG": "C.UTF-8",
        "TANGRAM_ENV_ID": "env-1",
        "TANGRAM_CPUS": "3",
        "OMP_NUM_THREADS": "3",
        "MKL_NUM_THREADS": "3",
        "OPENBLAS_NUM_THREADS": "3",
        "PYTEST_XDIST_AUTO_NUM_WORKERS": "3",
    }
    elastic = command_env("env-1", 3, "/work", elastic=True, plugin_dir="/opt/t")
    assert elastic["PYTEST_PLUGINS"] == PLUGIN and elastic["PYTHONPATH"] == "/opt/t"


@pytest.mark.parametrize(
    "args,cpus,xdist,worker,expected",
    [
        (["-q", "tests"], "4", True, False, 4),
        (["-q"], "4", False, False, 0),  # no xdist: leave pytest alone
        (["-q"], "1", True, False, 0),  # one core: serial is faster than one worker
        (["-n", "2"], "4", True, False, 0),  # the command chose
        (["-n3"], "4", True, False, 0),
        (["--numprocesses=auto"], "4", True, False, 0),
        (["-p", "no:xdist"], "4", True, False, 0),
        (["-q"], "4", True, True, 0),  # inside an xdist worker
        (["-q"], None, True, False, 0),
        (["-q"], "x", True, False, 0),
        (["--new-first"], "2", True, False, 2),  # not a -n
    ],
)
def test_plugin_adds_workers_only_where_it_cannot_break(args, cpus, xdist, worker, expected):
    assert workers_to_add(args, cpus, xdist, worker) == expected


def xdist_workers(stdout: str) -> int:
    """Workers xdist started, from its header: `created: N/N workers` (>= 3.2) or `gw0 I`."""
    m = re.search(r"created: (\d+)/\d+ workers", stdout)
    return int(m.group(1)) if m else len(set(re.findall(r"\bgw(\d+) ", stdout)))


def _pytest_in(folder, tmp_path, block_xdist: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_x.py").write_text("def test_one():\n    pass\n")
    block = "import sys; sys.modules['xdist'] = None; " if block_xdist else ""
    code = f"{block}import pytest, sys; sys.exit(pytest.main(['-p', 'no:cacheprovider']))"
    env = {
        "PATH": os.environ.get("PATH", SAFE_PATH),
        "PYTEST_PLUGINS": PLUGIN,
        "PYTHONPATH": str(folder),
        "TANGRAM_CPUS": "2",
    }
    if block_xdist:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plugin_never_breaks_a_python_without_xdist(tmp_path):
    folder = install_plugin(tmp_path / "lib")
    assert (folder / PLUGIN_SOURCE.name).read_text() == PLUGIN_SOURCE.read_text()
    work = tmp_path / "w"
    work.mkdir()
    done = _pytest_in(folder, work, block_xdist=True)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    assert xdist_workers(done.stdout) == 0


def test_plugin_gives_xdist_the_granted_cores(tmp_path):
    pytest.importorskip("xdist")
    folder = install_plugin(tmp_path / "lib")
    work = tmp_path / "w"
    work.mkdir()
    done = _pytest_in(folder, work, block_xdist=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert xdist_workers(done.stdout) == 2, done.stdout
