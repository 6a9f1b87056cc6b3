"""Apptainer/Singularity images (`.sif`): find the root filesystem in one, read with our own
parser of the published Singularity Image Format (Sylabs' SIF, version 01), then unpacked by
squashfs-tools' `unsquashfs`.

A SIF file is a global header, a table of data-object descriptors, then the objects. All
numbers are little-endian, packed without padding:

    header (128 bytes)   launch script [32] ("#!/usr/bin/env run-singularity\\n"), magic [10]
                         ("SIF_MAGIC\\0"), version [3] ("01\\0"), arch [3], id [16], then int64
                         created, modified, descriptors free, descriptors total, descriptors
                         offset, descriptors size, data offset, data size
    descriptor (585)     int32 data type, uint8 used, uint32 id, group id, linked id, int64
                         offset, size, size with padding, created, modified, uid, gid (both
                         unused), name [128], extra [384]; a partition's extra starts with
                         int32 file-system type, int32 partition type, arch [3]

The root filesystem is the descriptor in use of type partition (0x4004) whose partition type is
the primary system (2), else a system one (1); its file system must be squashfs (1). Encrypted
squashfs (5) and ext3 (2) partitions are refused, naming what was found.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tangram.errors import ValidationError

MAGIC = b"SIF_MAGIC\0"
LAUNCH = b"#!/usr/bin/env run-singularity\n"
HEADER = struct.Struct("<32s10s3s3s16s8q")
DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
PARTITION = struct.Struct("<ii3s")
DATA_PARTITION = 0x4004
FS_SQUASH, FS_EXT3, FS_ENCRYPTED = 1, 2, 5
PART_SYSTEM, PART_PRIMARY = 1, 2
FS_NAMES = {1: "squashfs", 2: "ext3", 3: "archive", 4: "raw", 5: "encrypted squashfs"}
MAX_DESCRIPTORS = 4096  # far above what any SIF writer makes (48 by default)


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition object of a SIF file: where its bytes are and what it holds."""

    id: int
    offset: int
    size: int
    fs: int
    kind: int
    name: str


def is_sif(path: str | Path) -> bool:
    """Whether `path` is a file that starts with a SIF header (by its magic, not its name)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except (OSError, IsADirectoryError):
        return False
    return len(head) == HEADER.size and head[32:42] == MAGIC


def partitions(path: str | Path) -> list[Partition]:
    """The partitions in use in the SIF file at `path`; raises `ValidationError` naming `source`
    where the file is not a well-formed SIF."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size or head[32:42] != MAGIC:
            raise ValidationError("source", str(path), "is not a SIF file (no SIF_MAGIC)")
        fields = HEADER.unpack(head)
        version = fields[2].rstrip(b"\0")
        _, _, _, total, offset, _, _, _ = fields[5:]
        if version != b"01":
            raise ValidationError("source", str(path), f"SIF version {version!r}: only 01 is read")
        if not 0 <= total <= MAX_DESCRIPTORS or offset + total * DESCRIPTOR.size > size:
            raise ValidationError("source", str(path), "its descriptor table lies past its end")
        f.seek(offset)
        table = f.read(total * DESCRIPTOR.size)
    found = []
    for i in range(total):
        d = DESCRIPTOR.unpack_from(table, i * DESCRIPTOR.size)
        kind, used, ident, start, length, name, extra = d[0], d[1], d[2], d[5], d[6], d[12], d[13]
        if not used or kind != DATA_PARTITION:
            continue
        if start < 0 or length < 0 or start + length > size:
            raise ValidationError("source", str(path), f"partition {ident} lies past its end")
        fs, part, _ = PARTITION.unpack_from(extra)
        label = name.split(b"\0", 1)[0].decode(errors="replace")
        found.append(Partition(ident, start, length, fs, part, label))
    return found


def root_partition(path: str | Path) -> Partition:
    """The partition holding the image's root filesystem (module docstring); raises
    `ValidationError` naming what the file holds where none can be read."""
    parts = partitions(path)
    for want in (PART_PRIMARY, PART_SYSTEM):
        for p in parts:
            if p.kind == want:
                if p.fs != FS_SQUASH:
                    what = FS_NAMES.get(p.fs, f"file system type {p.fs}")
                    raise ValidationError(
                        "source", str(path), f"its root partition is {what}: only squashfs is read"
                    )
                return p
    raise ValidationError(
        "source",
        str(path),
        f"no system partition in it (partitions: "
        f"{', '.join(f'{p.id} {FS_NAMES.get(p.fs, p.fs)}' for p in parts) or 'none'})",
    )


def unpack(path: str | Path, dest: Path) -> None:
    """Unpack the image's root filesystem into the empty folder `dest` (`unsquashfs` reading
    the partition at its offset in the file: nothing is copied out first)."""
    part = root_partition(path)
    tool = shutil.which("unsquashfs") or shutil.which("unsquashfs", path="/usr/sbin:/sbin")
    if tool is None:
        raise ValidationError(
            "source", str(path), "unsquashfs not found: install squashfs-tools to import a SIF"
        )
    argv = [tool, "-no-progress", "-quiet", "-no-xattrs", "-f", "-d", str(dest)]
    argv += ["-o", str(part.offset), str(path)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise ValidationError(
            "source", str(path), f"unsquashfs could not read its root ({why[-1] if why else '?'})"
        )
