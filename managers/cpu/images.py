"""The node's image store: root filesystems, content-addressed, shared read-only by every
environment made from them.

Layout under the store's folder (`state_dir/images`):

    blobs/<digest>/rootfs     the image's tree (never written after import; environments use
                              it as the read-only lower layer of their overlay)
    blobs/<digest>/meta.json  {"digest", "source", "bytes", "created", "dropped" (counts),
                              "dropped_paths" (the first 50)}
    tags.json                 {name: digest}, replaced atomically (write, fsync, rename)
    build-cache.json          {step key: digest} (`build`: each step cached by its inputs)
    tmp/<tangram-pid-...>     imports in progress (a dead server's are swept)

The digest is `sha256:` of a manifest of the tree (every path, its type, mode, owner, size and
the sha256 of its content or its link target, sorted): the same tree imported from a folder, a
tarball or an OCI layout gets the same digest, and an import of a tree already stored costs one
pass over it and no copy. Sources: a root-filesystem folder, a tarball (what `docker export`
writes; gzip, bzip2 and xz are read by GNU tar) or an OCI image layout (`index.json` ->
manifest -> layer tarballs applied in order, with `.wh.` whiteouts and `.wh..wh..opq` opaque
folders), or an Apptainer/Singularity `.sif` file (its squashfs root partition, found by our
own reading of the SIF header: `sif`, unpacked by unsquashfs). Extraction is GNU tar's, as
root, with ownership and modes kept and members outside the tree refused
(`--no-same-permissions` is not used: modes matter). Whatever the source (folder, tarball, OCI
layout, SIF, build), setuid/setgid bits and device nodes are dropped before the tree is
stored, logged and listed in `meta.json` (`sanitize`; the sandbox's `no_new_privs`, nosuid and
nodev made them inert inside, but on the host they are a risk to its local users).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from managers.cpu import sif
from managers.cpu.leftovers import owned_name, sweep_workdirs
from tangram.errors import NotFound, TangramError, ValidationError

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}(:[A-Za-z0-9._-]{1,64})?$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
log = logging.getLogger("tangram.images")


@dataclass(frozen=True, slots=True)
class Image:
    """One stored image: `rootfs` is the host folder environments use as their lower layer."""

    digest: str
    rootfs: str
    bytes: int
    names: tuple[str, ...] = ()
    source: str = ""
    dropped: tuple[tuple[str, int], ...] = ()
    """What the import dropped (`sanitize`): ("setuid", n) and ("devices", n) where n > 0."""

    def to_dict(self) -> dict:
        return {
            "digest": self.digest,
            "names": list(self.names),
            "bytes": self.bytes,
            "rootfs": self.rootfs,
            "source": self.source,
            "dropped": dict(self.dropped),
        }


class ImageStore:
    """Images under `root` (created on first use). Safe for several servers of one node at
    once: imports land under a private name and are renamed into place; tags are updated
    under a file lock."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.tmp = self.root / "tmp"
        for d in (self.blobs, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.blobs.chmod(0o755)  # the sandbox's own user walks down to its image's lower

    # -- names -----------------------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Remove the half-done imports of servers that died."""
        return sweep_workdirs(self.tmp)

    def tags(self) -> dict[str, str]:
        try:
            doc = json.loads((self.root / "tags.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _write_json(self, name: str, doc: dict) -> None:
        tmp = self.root / f".{name}.{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / name)

    def tag(self, name: str, digest: str) -> None:
        check_name(name)
        with self._locked():
            tags = self.tags()
            tags[name] = digest
            self._write_json("tags.json", tags)

    # -- lookup ----------------------------------------------------------------------------------
    def resolve(self, ref: str, field: str = "image") -> Image:
        """The image named `ref` (a name, or a digest `sha256:...`); `NotFound` otherwise."""
        if not isinstance(ref, str) or not ref:
            raise ValidationError(field, ref, "must be an image name or digest")
        tags = self.tags()
        digest = ref if DIGEST.match(ref) else tags.get(ref) or tags.get(f"{ref}:latest")
        if digest is None or not (self.blobs / _hexof(digest) / "rootfs").is_dir():
            raise NotFound(
                field,
                ref,
                f"no such image on this node (have: "
                f"{sorted(tags) or 'none'}; import one with `tangram "
                f"image import NAME SOURCE`)",
            )
        return self._image(digest, tags)

    def _image(self, digest: str, tags: dict[str, str]) -> Image:
        folder = self.blobs / _hexof(digest)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        return Image(
            digest,
            str(folder / "rootfs"),
            int(meta.get("bytes", 0)),
            tuple(sorted(n for n, d in tags.items() if d == digest)),
            str(meta.get("source", "")),
            tuple((k, int(n)) for k, n in (meta.get("dropped") or {}).items() if n),
        )

    def pin(self, digest: str) -> int:
        """Hold the image against `rm` (by this or any other process) until `unpin`: a shared
        lock on its meta file, which dies with the process."""
        fd = os.open(self.blobs / _hexof(digest) / "meta.json", os.O_RDONLY | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    @staticmethod
    def unpin(fd: int) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)

    def ls(self) -> list[Image]:
        tags = self.tags()
        found = []
        for folder in sorted(self.blobs.iterdir()):
            if (folder / "rootfs").is_dir():
                found.append(self._image(f"sha256:{folder.name}", tags))
        return found

    def rm(self, ref: str) -> list[str]:
        """Untag `ref` (or every name of a digest); the tree goes once no name refers to it.
        Refuses an image that an environment or snapshot of any server uses (`pin`).
        Returns the names removed."""
        image = self.resolve(ref)
        with self._locked():
            tags = self.tags()
            names = [ref] if ref in tags else [n for n, d in tags.items() if d == image.digest]
            if ref not in tags and f"{ref}:latest" in tags:
                names = [f"{ref}:latest"]
            remaining = {n: d for n, d in tags.items() if n not in names}
            if image.digest not in remaining.values():
                with open(self.blobs / _hexof(image.digest) / "meta.json") as meta:
                    try:
                        fcntl.flock(meta, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        raise ValidationError(
                            "image",
                            ref,
                            "an environment or snapshot uses it: close or delete that first",
                        ) from None
                doomed = self.tmp / owned_name(f"rm-{uuid.uuid4().hex[:8]}")
                os.rename(self.blobs / _hexof(image.digest), doomed)
                shutil.rmtree(doomed, ignore_errors=True)
            self._write_json("tags.json", remaining)
        return names

    # -- import ----------------------------------------------------------------------------------
    def import_(self, name: str, source: str | os.PathLike) -> Image:
        """Store the tree of `source` (a root-filesystem folder, a tarball, an OCI image
        layout folder or an Apptainer/Singularity `.sif` file) and name it `name`; returns the
        image."""
        check_name(name)
        src = Path(source)
        if not src.exists():
            raise ValidationError("source", str(source), "no such file or folder")
        staging = self.tmp / owned_name(uuid.uuid4().hex[:10])
        tree = staging / "rootfs"
        tree.mkdir(parents=True)
        try:
            if src.is_dir() and (src / "index.json").is_file() and (src / "oci-layout").exists():
                kind = "oci"
                _apply_oci(src, tree)
            elif src.is_dir():
                kind = "folder"
                _copy_tree(src, tree)
            elif sif.is_sif(src):  # Apptainer/Singularity: its squashfs root partition
                kind = "sif"
                sif.unpack(src, tree)
            else:
                kind = "tarball"
                _untar(src, tree)
            return self._commit(name, staging, f"{kind}:{src.resolve()}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _commit(self, name: str | None, staging: Path, source: str) -> Image:
        """Hash the staged tree, move it into `blobs/` (unless that digest is stored already)
        and tag it."""
        tree = staging / "rootfs"
        tree.chmod(0o755)
        dropped = sanitize(tree)
        for kind, paths in dropped.items():
            if paths:
                log.warning(
                    "image %s: dropped %d %s (%s%s)",
                    name or source,
                    len(paths),
                    "setuid/setgid bits" if kind == "setuid" else "device nodes",
                    ", ".join(paths[:5]),
                    ", ..." if len(paths) > 5 else "",
                )
        digest, size = tree_digest(tree)
        meta = {"digest": digest, "source": source, "bytes": size, "created": time.time()}
        meta["dropped"] = {k: len(v) for k, v in dropped.items()}  # and their first paths:
        meta["dropped_paths"] = [p for v in dropped.values() for p in v][:50]
        (staging / "meta.json").write_text(json.dumps(meta))
        target = self.blobs / _hexof(digest)
        with contextlib.suppress(OSError):  # already there (same tree): keep the stored one
            os.rename(staging, target)
        if name is not None:
            self.tag(name, digest)
        return self._image(digest, self.tags())

    def commit_tree(self, name: str | None, staging: Path, source: str) -> Image:
        """`import_` for a tree already staged by a builder at `staging/rootfs` (under
        `self.tmp`); `name` None: stored by digest only (a build step)."""
        return self._commit(name, staging, source)

    def staging(self) -> Path:
        """A fresh private folder under `tmp/` for a builder (swept if the server dies)."""
        staging = self.tmp / owned_name(uuid.uuid4().hex[:10])
        (staging / "rootfs").mkdir(parents=True)
        return staging


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValidationError(
            "image",
            name,
            "must be a lowercase name [a-z0-9._-] of at most 64 characters, optionally :tag",
        )
    return name


def _hexof(digest: str) -> str:
    return digest.split(":", 1)[1]


def tree_digest(tree: Path) -> tuple[str, int]:
    """`sha256:` of the tree's manifest (see the module docstring) and its size in bytes."""
    h = hashlib.sha256()
    total = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for entry in sorted([*dirnames, *filenames]):
            p = os.path.join(dirpath, entry)
            st = os.lstat(p)
            rel = os.path.relpath(p, tree)
            if stat.S_ISREG(st.st_mode):
                content = _file_sha(p)
                total += st.st_size
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(p)
            else:
                content = (
                    f"{st.st_rdev}" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else ""
                )
            size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size
            line = f"{rel}\0{st.st_mode:o}\0{st.st_uid}\0{st.st_gid}\0{size}\0{content}\n"
            h.update(line.encode(errors="surrogateescape"))
    return f"sha256:{h.hexdigest()}", total


def _file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise TangramError(f"{what} failed: {' '.join(argv)}: {done.stderr.strip()[-800:]}")


def _copy_tree(src: Path, dest: Path) -> None:
    """`cp -a` of the folder's content (ownership, modes, links, hard links, xattrs kept)."""
    _run(["cp", "-a", "--", f"{src}/.", str(dest)], f"copying {src}")


def _untar(tarball: Path, dest: Path, exclude_whiteouts: bool = False) -> None:
    argv = [
        "tar",
        "-x",
        "-f",
        str(tarball),
        "-C",
        str(dest),
        "--numeric-owner",
        "--same-owner",
        "--no-overwrite-dir",
        "--delay-directory-restore",
    ]
    if exclude_whiteouts:
        argv += ["--exclude", f"{WHITEOUT}*"]
    _run(argv, f"extracting {tarball}")


def sanitize(tree: Path) -> dict[str, list[str]]:
    """Drop what a stored image must not hold on the host, whatever the source: setuid and
    setgid bits of regular files (a root 4755 binary under a world-readable store) and device
    nodes (a 0666 block device for the host's disk). Inside a sandbox they were inert already
    (nosuid, nodev, `no_new_privs`); on the host they are a risk to its local users. Returns
    the paths (relative to the tree) of each kind dropped."""
    dropped: dict[str, list[str]] = {"setuid": [], "devices": []}
    for dirpath, dirnames, filenames in os.walk(tree):
        for fn in filenames + dirnames:
            p = os.path.join(dirpath, fn)
            st = os.lstat(p)
            rel = os.path.relpath(p, tree)
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                os.unlink(p)
                dropped["devices"].append(rel)
            elif stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                dropped["setuid"].append(rel)
    return dropped


def _apply_oci(layout: Path, dest: Path) -> None:
    """The first manifest of an OCI image layout (one platform), its layers applied in order."""
    doc = json.loads((layout / "index.json").read_text())
    for _ in range(3):  # index.json -> (an image index ->) a manifest
        if not isinstance(doc, dict) or "manifests" not in doc:
            break
        if not doc["manifests"]:
            raise ValidationError("source", str(layout), "the OCI index lists no manifest")
        doc = json.loads(_blob_path(layout, doc["manifests"][0].get("digest", "")).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise ValidationError("source", str(layout), "no OCI image manifest with layers found")
    for layer in doc["layers"]:
        blob = _blob_path(layout, layer.get("digest", ""))
        _apply_whiteouts(blob, dest)
        _untar(blob, dest, exclude_whiteouts=True)


def _blob_path(layout: Path, digest: str) -> Path:
    algo, _, hexd = str(digest).partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexd):
        raise ValidationError("source", digest, "an OCI blob digest must be sha256:<64 hex>")
    p = layout / "blobs" / "sha256" / hexd
    if not p.is_file():
        raise ValidationError("source", str(p), "the OCI layout lacks this blob")
    return p


def _apply_whiteouts(blob: Path, dest: Path) -> None:
    """Delete what this layer's whiteouts hide in the layers below, before it is extracted."""
    with tarfile.open(blob) as tar:
        for member in tar:
            parts = member.name.lstrip("./").split("/") if member.name not in (".", "./") else []
            if not parts or ".." in parts or not parts[-1].startswith(WHITEOUT):
                continue
            parent = dest.joinpath(*parts[:-1])
            if _escapes(dest, parent):
                continue
            if parts[-1] == OPAQUE:
                if parent.is_dir() and not parent.is_symlink():
                    for child in parent.iterdir():
                        _remove(child)
            else:
                victim = parent / parts[-1][len(WHITEOUT) :]
                if not _escapes(dest, victim.parent):
                    _remove(victim)


def _escapes(root: Path, p: Path) -> bool:
    """Whether `p` (resolved, links followed inside the host) leaves `root`."""
    try:
        return not p.resolve().is_relative_to(root.resolve())
    except OSError:
        return True


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
