"""Image import drops setuid/setgid bits and device nodes on every path (issue 36, item 6): a
folder (`cp -a` kept both), a tarball, an OCI layout and a build commit store none of them on
the host, and say what they dropped (the image's `dropped`, its meta.json, the CLI's line).

Real components: the node's image store on this machine's disk, GNU cp and tar, `mknod` (as
root; the device part is skipped, saying why, without it)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from managers.cpu.images import ImageStore

ROOT = os.geteuid() == 0


def _hostile(root: Path) -> None:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "su").write_text("#!/bin/sh\n")
    os.chmod(root / "bin" / "su", 0o4755)  # a setuid binary
    (root / "bin" / "wall").write_text("#!/bin/sh\n")
    os.chmod(root / "bin" / "wall", 0o2755)  # setgid
    (root / "bin" / "plain").write_text("#!/bin/sh\n")
    os.chmod(root / "bin" / "plain", 0o755)
    (root / "dev").mkdir()
    if ROOT:
        os.mknod(root / "dev" / "vda", stat.S_IFBLK | 0o666, os.makedev(253, 0))
        os.mknod(root / "dev" / "mem", stat.S_IFCHR | 0o666, os.makedev(1, 1))


def _check(image, expect_devices: bool) -> None:
    tree = Path(image.rootfs)
    for dirpath, dirnames, filenames in os.walk(tree):
        for fn in dirnames + filenames:
            mode = os.lstat(os.path.join(dirpath, fn)).st_mode
            assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), fn
            assert not (stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID)), fn
    assert stat.S_IMODE(os.lstat(tree / "bin" / "su").st_mode) == 0o755  # the rest of the mode
    assert stat.S_IMODE(os.lstat(tree / "bin" / "plain").st_mode) == 0o755
    dropped = dict(image.dropped)
    assert dropped.get("setuid") == 2
    assert dropped.get("devices", 0) == (2 if expect_devices else 0)
    meta = json.loads((tree.parent / "meta.json").read_text())
    assert "bin/su" in meta["dropped_paths"] and "bin/wall" in meta["dropped_paths"]
    if expect_devices:
        assert "dev/vda" in meta["dropped_paths"]


def test_a_folder_import_drops_setuid_bits_and_device_nodes(tmp_path: Path) -> None:
    src = tmp_path / "rootfs"
    _hostile(src)
    _check(ImageStore(tmp_path / "store").import_("folder", src), ROOT)


def test_a_tarball_and_an_oci_layout_drop_them_too(tmp_path: Path) -> None:
    src = tmp_path / "rootfs"
    _hostile(src)
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-cf", str(tarball), "-C", str(src), "."], check=True)
    store = ImageStore(tmp_path / "store")
    a = store.import_("tar", tarball)
    _check(a, ROOT)
    # an OCI layout of one layer: the same tree, so the same digest, stored once
    blob = tarball.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    oci = tmp_path / "oci"
    (oci / "blobs" / "sha256").mkdir(parents=True)
    (oci / "blobs" / "sha256" / digest).write_bytes(blob)
    manifest = json.dumps({"layers": [{"digest": f"sha256:{digest}"}]}).encode()
    mdigest = hashlib.sha256(manifest).hexdigest()
    (oci / "blobs" / "sha256" / mdigest).write_bytes(manifest)
    (oci / "index.json").write_text(json.dumps({"manifests": [{"digest": f"sha256:{mdigest}"}]}))
    (oci / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    b = store.import_("oci", oci)
    assert b.digest == a.digest
    tree = Path(b.rootfs)
    assert stat.S_IMODE(os.lstat(tree / "bin" / "su").st_mode) == 0o755


def test_a_builders_commit_is_sanitized(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    staging = store.staging()
    tree = staging / "rootfs"
    (tree / "bin").mkdir()
    (tree / "bin" / "su").write_text("#!/bin/sh\n")
    os.chmod(tree / "bin" / "su", 0o4755)
    image = store.commit_tree(None, staging, "build:test")
    assert stat.S_IMODE(os.lstat(Path(image.rootfs) / "bin" / "su").st_mode) == 0o755
    assert dict(image.dropped) == {"setuid": 1}


@pytest.mark.skipif(not ROOT, reason="mknod of the device nodes needs root")
def test_the_cli_says_what_it_dropped(tmp_path: Path) -> None:
    src = tmp_path / "rootfs"
    _hostile(src)
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "image", "--state-dir", str(tmp_path)]
        + ["import", "hostile", str(src)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "dropped setuid/setgid bits of 2 entries" in out.stdout
    assert "dropped device nodes of 2 entries" in out.stdout
