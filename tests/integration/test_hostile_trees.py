"""Issue 22, findings 2 and 4: a tree a command leaves in its work folder (1,100+ levels deep,
200,000 files, links out, folders without permissions, immutable entries) never makes close,
shutdown or the next server's sweep fail, and its removal never blocks the event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest

from managers.cpu import CpuManager, ExecRequest
from managers.cpu.backends.affinity import AffinityBackend
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.leftovers import sweep_workdirs
from managers.cpu.removal import remove_tree
from tangram.errors import ValidationError

DEEP = (
    "import os\n"
    "for _ in range({n}):\n"
    "    os.mkdir('d'); os.chdir('d'); open('f', 'w').close()\n"
    "os.symlink('/etc/passwd', 'link'); os.symlink('/usr', 'dlink')\n"
    "os.chmod('.', 0o500)\n"
)
MANY = "import os\nos.mkdir('many')\nfor i in range({n}):\n    open(f'many/{{i}}', 'w').close()\n"


def _deep_tree(root: Path, depth: int) -> None:
    """`depth` nested folders below `root` (deeper than PATH_MAX), built with relative paths."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
            os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_remove_tree_handles_depth_links_permissions_and_immutable_entries(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    top = tmp_path / "top"
    top.mkdir()
    _deep_tree(top, 1_500)
    (top / "link").symlink_to(outside)
    (top / "flink").symlink_to(outside / "keep")
    locked = top / "locked"
    locked.mkdir()
    (locked / "inner").mkdir()
    (locked / "inner" / "x").write_text("x")
    locked.chmod(0)
    imm = top / "imm"
    imm.mkdir()
    (imm / "x").write_text("x")
    flagged = (
        subprocess.run(["chattr", "+i", str(imm / "x")], capture_output=True).returncode == 0
        and subprocess.run(["chattr", "+a", str(imm)], capture_output=True).returncode == 0
    )
    assert remove_tree(top) == []
    assert not top.exists()
    assert (outside / "keep").read_text() == "x"  # links removed, never followed
    if not flagged:
        pytest.skip("chattr +i/+a unsupported here: the rest passed")


def test_remove_tree_of_a_link_or_missing_path(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (tmp_path / "l").symlink_to(target)
    assert remove_tree(tmp_path / "l") == [] and target.is_dir()
    assert remove_tree(tmp_path / "nothing") == []


def test_the_sweep_removes_a_dead_servers_deep_tree(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = tmp_path / f"tangram-{dead.pid}-e1"
    folder.mkdir()
    _deep_tree(folder, 1_200)
    swept = sweep_workdirs(tmp_path)
    assert len(swept) == 1 and "left" not in swept[0]
    assert not folder.exists()


@pytest.fixture(scope="module")
def bwrap_or_skip() -> None:
    why = BwrapBackend.probe()
    if why is not None:
        pytest.skip(f"bwrap backend unavailable: {why}")


@pytest.mark.cgroup
def test_a_deep_hostile_tree_closes_cleanly_and_the_next_server_starts(bwrap_or_skip):
    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        env = await m.open_env("t", 256)
        made = await m.execute(
            ExecRequest(env, ["/usr/bin/python3", "-c", DEEP.format(n=1_100)], timeout=120)
        )
        workdir = m.envs.get(env).workdir
        await m.close_env(env)  # no RecursionError, no leftovers
        gone = not os.path.exists(workdir)
        await m.close()
        again = CpuManager(BwrapBackend())  # its start-up sweep
        await again.start()
        await again.close()
        return made, gone, again.swept

    made, gone, swept = asyncio.run(go())
    assert made.status == "ok", made
    assert gone
    assert not any("left" in s for s in swept)


@pytest.mark.cgroup
def test_closing_200000_files_does_not_block_other_clients(bwrap_or_skip):
    """While one environment with 200,000 files is closed, another's exec runs and returns:
    the removal runs in a thread, not on the loop."""

    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            big = await m.open_env("big", 512)
            other = await m.open_env("other", 128)
            made = await m.execute(
                ExecRequest(big, ["/usr/bin/python3", "-c", MANY.format(n=200_000)], timeout=300)
            )
            closing = asyncio.ensure_future(m.close_env(big))
            await asyncio.sleep(0.05)  # the close is under way
            echo = await m.execute(ExecRequest(other, "echo hi"))
            still_closing = not closing.done()
            await closing
            return made, echo, still_closing
        finally:
            await m.close()

    made, echo, still_closing = asyncio.run(go())
    assert made.status == "ok", made
    assert echo.stdout == "hi\n"
    assert still_closing  # the echo was served while the tree was being removed


def test_a_fifo_at_a_written_path_is_refused_without_waiting(tmp_path):
    """A command leaves a FIFO where the next request's file goes: writing it (small writes
    run on the event loop) fails at once naming the path, instead of waiting for a reader.
    An alarm turns a hang into a failure."""

    class Hung(BaseException):  # not an OSError: nothing on the way may turn it into another
        pass

    def hung(*_):
        raise Hung("write_files waited on the FIFO")

    async def go():
        m = CpuManager(AffinityBackend(), workdir_root=str(tmp_path))
        await m.start()
        try:
            env = await m.open_env("t", 64)
            made = await m.execute(ExecRequest(env, "mkfifo main.py"))
            assert made.status == "ok", made.stderr
            with pytest.raises(ValidationError, match="main.py"):
                await m.write_files(env, {"main.py": b"print(1)"})
        finally:
            await m.close()

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        asyncio.run(go())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
