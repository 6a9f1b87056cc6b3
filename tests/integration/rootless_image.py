"""Run by `test_rootless` as the unprivileged user, with TANGRAM_STATE_DIR set: build a small
image, write it into a .sif (our own SIF writer around mksquashfs's squashfs), import the .sif
with `tangram image import`, open two environments on it and print, as JSON, what their
commands saw (the image's file, their uids, a write to their own layer that the other does not
see, the work folder written through the files API)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_sif import squashfs_of, write_sif

from managers.cpu import CpuManager, ExecRequest, sif
from managers.cpu.build import build
from managers.cpu.images import ImageStore


def make_sif(state: Path) -> Path:
    store = ImageStore(state / "images")
    tree = build(
        store,
        "tools",
        [
            {"host": {"programs": ["sh", "cat", "id", "mkdir", "ls"]}},
            {"file": {"path": "/etc/marker", "content": "from-a-sif\n"}},
        ],
    )
    folder = Path(tempfile.mkdtemp())
    image = folder / "tools.sif"
    fs = squashfs_of(Path(tree.rootfs), folder / "t.sqfs")
    write_sif(image, [(sif.DATA_PARTITION, fs, (sif.FS_SQUASH, sif.PART_PRIMARY), "rootfs")])
    return image


async def main(image: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "image", "import", "from-sif", str(image)],
        capture_output=True,
        text=True,
    )
    m = CpuManager("bwrap")
    await m.start()
    try:
        a = await m.open_env("a", 256, image="from-sif")
        b = await m.open_env("b", 256, image="from-sif")
        await m.write_files(a, {"note": b"hello\n"})
        cmd = "cat /etc/marker; id -u; cat /sandbox/note; mkdir /tmp/own && echo made"
        seen_a = await m.execute(ExecRequest(a, cmd))
        seen_b = await m.execute(ExecRequest(b, "id -u; cat /sandbox/note 2>&1; ls /tmp"))
        return {
            "import": [done.returncode, done.stdout + done.stderr],
            "a": [seen_a.status.value, seen_a.stdout, seen_a.stderr],
            "b": [seen_b.status.value, seen_b.stdout, seen_b.stderr],
            "lost": m.backend.guarantees_lost,
        }
    finally:
        await m.close()


if __name__ == "__main__":
    state = Path(os.environ["TANGRAM_STATE_DIR"])
    print(json.dumps(asyncio.run(main(make_sif(state)))))
