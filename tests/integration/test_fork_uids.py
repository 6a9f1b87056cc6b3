"""A fork group shares no per-uid kernel state: each child, and each environment opened from a
snapshot, runs as a uid of its own (never reused) and still owns the files it inherits
(idmapped layers, `managers.cpu.idmap`); where the kernel refuses idmapped layers, the fallback
(the source's uid) is taken and said.

Real components: bwrap sandboxes (root), loop-mounted ext4 layers, overlayfs over idmapped
clones, the kernel's per-user inotify limit. The tests of the first kind fail on the children
that ran as their parent's uid: one child's 128 inotify instances made its sibling's
`inotify_init1` fail with EMFILE."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.build import build
from managers.cpu.idmap import LAYER_OWNER, id_map
from managers.cpu.images import ImageStore
from managers.cpu.layers import LayerStore, unmount_below
from managers.cpu.request import ExecRequest


def _reason() -> str | None:
    why = BwrapBackend.probe()
    if why is not None:
        return why
    if shutil.which("python3") is None:
        return "no python3 on the host (the sandbox's inotify probe)"
    with tempfile.TemporaryDirectory() as d:
        return LayerStore(d).idmap_why_not


REASON = _reason()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"needs root, bwrap and idmapped overlay layers: {REASON}"
)
# hold every inotify instance the per-user limit allows, say how many, keep them a while
HOG = (
    "python3 -c 'import ctypes,time; c=ctypes.CDLL(None); "
    "n=sum(c.inotify_init1(0) >= 0 for _ in range(100000)); print(n, flush=True); time.sleep(4)'"
)
ONE = "python3 -c 'import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)'"


@pytest.fixture
def state(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    yield tmp_path
    unmount_below(tmp_path)


async def _sh(m: CpuManager, env: str, command: str) -> str:
    result = await m.execute(ExecRequest(env, command, timeout=60))
    assert result.exit_code == 0, result
    return result.stdout


def _uid(m: CpuManager, env: str) -> int:
    uid = m.sandbox(env).uid
    assert uid is not None
    return uid


def test_the_map_sends_the_layer_owner_to_the_uid_and_every_other_id_to_itself() -> None:
    for uid in (1, 2_000_000, LAYER_OWNER - 1):
        lines = [tuple(map(int, line.split())) for line in id_map(uid).splitlines()]
        assert (LAYER_OWNER, uid, 1) in lines
        inside = sorted((a, a + n) for a, _, n in lines)
        outside = sorted((b, b + n) for _, b, n in lines)
        for spans in (inside, outside):  # no id on either side covered twice
            assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))
        assert sum(n for *_, n in lines) == (1 << 32) - 1 - 1  # all but the uid itself inside
        assert all(a == b for a, b, _ in lines if a != LAYER_OWNER)
    with pytest.raises(ValueError):
        id_map(LAYER_OWNER)


def test_each_child_and_each_snapshot_environment_has_a_uid_of_its_own(state: Path) -> None:
    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            parent = await m.open_env("parent", 128, disk_mb=64)
            await _sh(m, parent, "umask 077; echo mine > f; mkdir d; echo x > d/g")
            kids = await m.fork_env(parent, ["a", "b"])
            snap = await m.snapshot(parent)
            opened = await m.open_env("from-snapshot", 128, snapshot=snap)
            envs = [parent, *kids, opened]
            uids = [_uid(m, e) for e in envs]
            assert len(set(uids)) == len(uids), uids
            for env, uid in zip(envs, uids):
                # the inherited files are the environment's own: a 0600 file it may append to
                out = await _sh(m, env, f"echo {env} >> f; stat -c '%u %a' . f d d/g; cat f")
                lines = out.splitlines()
                assert lines[:4] == [f"{uid} 700", f"{uid} 600", f"{uid} 700", f"{uid} 600"]
                assert lines[4:] == ["mine", env], out  # and its own copy of them
            await m.close_env(kids[0])
            again = await m.fork_env(parent, ["c"])
            assert _uid(m, again[0]) not in uids  # a closed child's uid is not handed out again
        finally:
            await m.close()

    asyncio.run(go())


def test_one_childs_inotify_instances_do_not_starve_its_sibling(state: Path) -> None:
    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            parent = await m.open_env("parent", 128, disk_mb=64)
            a, b = await m.fork_env(parent, ["a", "b"])
            hog = asyncio.ensure_future(_sh(m, a, HOG))
            await asyncio.sleep(2)  # a holds all it may
            assert not hog.done()
            assert (await _sh(m, b, ONE)).strip() == "True"  # EMFILE when a and b share a uid
            assert (await _sh(m, parent, ONE)).strip() == "True"
            limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
            assert int((await hog).strip()) == limit  # a reached the per-user limit itself
        finally:
            await m.close()

    asyncio.run(go())


def test_a_child_of_an_image_environment_owns_its_work_folder_not_the_images_files(
    state: Path,
) -> None:
    build(ImageStore(state / "images"), "tools", [{"host": {"programs": ["sh", "stat", "id"]}}])

    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            parent = await m.open_env("parent", 128, image="tools")
            await _sh(m, parent, "echo x > /sandbox/f")
            (child,) = await m.fork_env(parent, ["child"])
            uid = _uid(m, child)
            assert uid != _uid(m, parent)
            out = await _sh(m, child, "stat -c %u /sandbox /sandbox/f /bin/sh /etc; id -u")
            assert out.split() == [str(uid), str(uid), "0", "0", str(uid)]
        finally:
            await m.close()

    asyncio.run(go())


def test_where_the_kernel_refuses_idmapped_layers_children_share_the_parents_uid_and_it_is_said(
    state: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(LayerStore, "_probe_idmap", lambda self: "refused for this test")

    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            parent = await m.open_env("parent", 128, disk_mb=64)
            await _sh(m, parent, "umask 077; echo mine > f")
            (child,) = await m.fork_env(parent, ["child"])
            assert _uid(m, child) == _uid(m, parent)
            assert (await _sh(m, child, "cat f")).strip() == "mine"
        finally:
            await m.close()

    with caplog.at_level(logging.WARNING, logger="managers.cpu.layers"):
        asyncio.run(go())
    assert any("not idmapped (refused for this test)" in r.getMessage() for r in caplog.records)
