"""Apptainer/Singularity `.sif` images: files written here by our own SIF writer (the published
layout: global header, descriptors, objects) around a squashfs made by mksquashfs. The reader
finds the root partition among other objects, refuses what it cannot read naming it (never a
traceback), and `tangram image import` of a .sif stores the very tree it was made from (the same
digest), which then opens as an environment's root."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.cpu import sif
from managers.cpu.images import ImageStore
from tangram.errors import ValidationError

SQUASH = shutil.which("mksquashfs") or shutil.which("mksquashfs", path="/usr/sbin:/sbin")
UNSQUASH = shutil.which("unsquashfs") or shutil.which("unsquashfs", path="/usr/sbin:/sbin")
need_tools = pytest.mark.skipif(
    SQUASH is None or UNSQUASH is None, reason="needs squashfs-tools (mksquashfs, unsquashfs)"
)
DEFFILE = 0x4001


def write_sif(path: Path, objects: list[tuple[int, bytes, tuple[int, int] | None, str]]) -> None:
    """A SIF file holding `objects` (data type, bytes, (fs, partition type) for a partition,
    name), each aligned to 4096 bytes after a table of 48 descriptors, as Sylabs' tools lay it."""
    total, table_at = 48, 4096
    data_at = table_at + total * sif.DESCRIPTOR.size
    data_at += -data_at % 4096
    descriptors, blobs, at = [], b"", data_at
    for i, (kind, data, part, name) in enumerate(objects):
        pad = -len(data) % 4096
        extra = sif.PARTITION.pack(part[0], part[1], b"02\0") if part else b""
        descriptors.append(
            sif.DESCRIPTOR.pack(
                kind, 1, i + 1, 0xF0000001, 0, at, len(data), len(data) + pad,
                0, 0, 0, 0, name.encode(), extra,
            )
        )  # fmt: skip
        blobs += data + b"\0" * pad
        at += len(data) + pad
    unused = [sif.DESCRIPTOR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b"", b"")] * (
        total - len(objects)
    )
    header = sif.HEADER.pack(
        sif.LAUNCH, sif.MAGIC, b"01\0", b"02\0", os.urandom(16),
        0, 0, total - len(objects), total, table_at, len(objects) * sif.DESCRIPTOR.size,
        data_at, len(blobs),
    )  # fmt: skip
    table = b"".join(descriptors + unused)
    body = header + b"\0" * (table_at - len(header)) + table
    path.write_bytes(body + b"\0" * (data_at - len(body)) + blobs)


def squashfs_of(tree: Path, out: Path) -> bytes:
    subprocess.run([SQUASH, str(tree), str(out), "-noappend", "-quiet", "-no-progress"], check=True)
    return out.read_bytes()


def _tree(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "marker").write_text("from-a-sif\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    os.chmod(root / "bin" / "tool", 0o755)
    (root / "lib").symlink_to("bin")
    return root


@need_tools
def test_the_root_partition_is_found_among_other_objects(tmp_path):
    fs = squashfs_of(_tree(tmp_path / "t"), tmp_path / "t.sqfs")
    image = tmp_path / "x.sif"
    write_sif(
        image,
        [
            (DEFFILE, b"Bootstrap: docker\nFrom: debian\n", None, "deffile"),
            (sif.DATA_PARTITION, b"data" * 100, (sif.FS_SQUASH, 3), "data"),  # a data partition
            (sif.DATA_PARTITION, fs, (sif.FS_SQUASH, sif.PART_PRIMARY), "rootfs"),
        ],
    )
    assert sif.is_sif(image) and not sif.is_sif(tmp_path / "t.sqfs")
    root = sif.root_partition(image)
    assert root.name == "rootfs" and root.size == len(fs) and root.offset % 4096 == 0
    with open(image, "rb") as f:
        f.seek(root.offset)
        assert f.read(root.size) == fs
    out = tmp_path / "out"
    sif.unpack(image, out)
    assert (out / "etc" / "marker").read_text() == "from-a-sif\n"
    assert os.readlink(out / "lib") == "bin" and os.access(out / "bin" / "tool", os.X_OK)


@pytest.mark.parametrize(
    ("objects", "says"),
    [
        ([(sif.DATA_PARTITION, b"x" * 10, (sif.FS_EXT3, sif.PART_PRIMARY), "r")], "ext3"),
        ([(sif.DATA_PARTITION, b"x" * 10, (sif.FS_ENCRYPTED, 1), "r")], "encrypted squashfs"),
        ([(DEFFILE, b"Bootstrap: x\n", None, "d")], "no system partition"),
    ],
)
def test_what_cannot_be_read_is_refused_naming_it(tmp_path, objects, says):
    image = tmp_path / "bad.sif"
    write_sif(image, objects)
    with pytest.raises(ValidationError, match=says):
        sif.root_partition(image)


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 8192), noise=st.binary(min_size=0, max_size=64))
def test_a_damaged_sif_is_a_validation_error_never_a_crash(cut, noise):
    with tempfile.TemporaryDirectory() as d:
        image = Path(d) / "x.sif"
        write_sif(image, [(sif.DATA_PARTITION, b"q" * 5000, (sif.FS_SQUASH, 2), "r")])
        raw = image.read_bytes()
        image.write_bytes(raw[:42] + noise + raw[42 + len(noise) : max(cut, 42 + len(noise))])
        try:
            part = sif.root_partition(image)
        except ValidationError as exc:
            assert "source" in str(exc)
        else:  # what is accepted lies inside the file
            assert part.offset + part.size <= image.stat().st_size


@need_tools
def test_image_import_of_a_sif_stores_the_tree_it_was_made_from(tmp_path):
    tree = _tree(tmp_path / "tree")
    store = ImageStore(tmp_path / "images")
    direct = store.import_("direct", tree)
    image = tmp_path / "app.sif"
    write_sif(
        image, [(sif.DATA_PARTITION, squashfs_of(tree, tmp_path / "a.sqfs"), (1, 2), "rootfs")]
    )
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "image", "--state-dir", str(tmp_path),
         "import", "from-sif", str(image)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    found = store.resolve("from-sif")
    assert (Path(found.rootfs) / "etc" / "marker").read_text() == "from-a-sif\n"
    if os.geteuid() == 0:  # (unprivileged, unsquashfs cannot keep the files' owners)
        assert found.digest == direct.digest  # the same tree: stored once
    bad = tmp_path / "bad.sif"
    write_sif(bad, [(sif.DATA_PARTITION, b"x", (sif.FS_EXT3, 2), "r")])
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "image", "--state-dir", str(tmp_path),
         "import", "bad", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0 and "ext3" in out.stderr and "Traceback" not in out.stderr


@need_tools
def test_a_sif_opens_as_an_environments_root(tmp_path):
    from managers.cpu import CpuManager
    from managers.cpu.backends.bwrap.backend import BwrapBackend
    from managers.cpu.build import build
    from managers.cpu.layers import LayerStore, unmount_below
    from managers.cpu.request import ExecRequest

    why = BwrapBackend.probe() or LayerStore(str(tmp_path)).why_not
    if why is not None:
        pytest.skip(f"images as an environment's root need the bwrap backend and layers: {why}")
    state = Path(tempfile.mkdtemp(prefix="tangram-sif-test."))
    os.chmod(state, 0o755)
    try:
        store = ImageStore(state / "images")
        tools = build(store, "tools", [{"host": {"programs": ["sh", "cat"]}}])
        image = tmp_path / "tools.sif"
        fs = squashfs_of(Path(tools.rootfs), tmp_path / "tools.sqfs")
        write_sif(image, [(sif.DATA_PARTITION, fs, (sif.FS_SQUASH, sif.PART_PRIMARY), "r")])
        assert store.import_("from-sif", image).digest == tools.digest

        async def go():
            m = CpuManager("bwrap", state_dir=str(state))
            await m.start()
            try:
                env = await m.open_env("sif-1", 256, image="from-sif", disk_mb=32)
                await m.write_files(env, {"/etc/marker": b"written\n"})
                return await m.execute(ExecRequest(env, "cat /etc/marker"))
            finally:
                await m.close()

        r = asyncio.run(go())
        assert r.status == "ok" and r.stdout.startswith("written"), (r.stdout, r.stderr)
    finally:
        unmount_below(state)
        shutil.rmtree(state, ignore_errors=True)


def test_the_header_layout_is_the_published_one():
    assert sif.HEADER.size == 128 and sif.DESCRIPTOR.size == 585
    assert struct.calcsize("<ii3s") == sif.PARTITION.size == 11
