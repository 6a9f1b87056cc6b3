"""Copy-on-write layers: an environment's files are a read-only stack (its image, then the
frozen layers of the forks and snapshots it descends from) under one private writable layer.

Mechanism (`LayerStore.probe` checks it once): overlayfs as root, each writable layer on its own
ext4 filesystem in a sparse file of `disk_mb` MiB, loop-mounted (`mkfs.ext4 -m 0 -O
^has_journal -E nodiscard`, created in ~0.1 s whatever its size). So:

- the disk bound is the kernel's: a write past it fails with ENOSPC inside, and the host's disk
  grows by at most `disk_mb` per environment (the file is sparse: only what was written takes
  blocks);
- fork and snapshot are O(1) in data: the writable layer is frozen where it lies (nothing is
  copied or flushed: the overlay is mounted `volatile`, so unmounting it syncs nothing) and
  becomes the top lower layer of the parent's, the children's and the snapshot's new stacks;
  each gets a fresh writable layer;
- a frozen layer stays mounted (read-write, never written again) while an environment or a
  snapshot stacks on it, and is unmounted and deleted (its loop device freed) with the last.

Everything lives under `state_dir/layers/<tangram-pid-...>` and `state_dir/roots/<tangram-
pid-...>` (mount points of the environments' merged roots), so a server that finds a dead
server's folders unmounts what is under them and removes them before it serves (`sweep`).

Where the kernel refuses overlayfs or loop devices, `probe` says why; the CPU manager then
refuses `image`, `disk_mb` and `snapshot` with that reason (environments without them keep
working as before).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from managers.cpu import idmap
from managers.cpu.leftovers import dead_owner, owned_name
from tangram.errors import BackendUnavailable, TangramError

log = logging.getLogger(__name__)
DEFAULT_DISK_MB = 1024  # per environment opened with an image (configurable per server)
MIN_DISK_MB = 8  # the smallest ext4 worth making
FULL_BYTES = 1 << 20  # a disk with less free than this (or no free inode) counts as full
MKFS = (
    "mkfs.ext4",
    "-q",
    "-F",
    "-m",
    "0",
    "-O",
    "^has_journal",
    "-E",
    "nodiscard,lazy_itable_init=1",
    "-T",
    "small",
)


@dataclass(eq=False, slots=True)
class Layer:
    """One layer folder: `fs/upper` holds its files (`fs` is its own ext4 when `disk_mb`)."""

    id: str
    path: Path
    disk_mb: int
    refs: int = 0  # stacks (of environments and snapshots) that have it frozen below them
    counted_mb: int = 0  # disk counted for it on its node once frozen

    @property
    def fs(self) -> Path:
        return self.path / "fs"

    @property
    def upper(self) -> Path:
        return self.fs / "upper"

    @property
    def work(self) -> Path:
        return self.fs / "work"


@dataclass(frozen=True, slots=True)
class Stack:
    """What an environment sees below its writable layer: frozen layers (newest first) over
    `base` (an image's rootfs, or an empty folder for an environment without image)."""

    base: str
    layers: tuple[Layer, ...] = ()
    image: str | None = None  # the image digest (None: no image, the tree is the work folder)

    def on(self, layer: Layer) -> Stack:
        return Stack(self.base, (layer, *self.layers), self.image)


@dataclass(eq=False, slots=True)
class Rooted:
    """An environment's mounted tree: `stack` read-only under `upper`, merged at `target`."""

    stack: Stack
    upper: Layer
    target: Path
    uid: int | None = None


class LayerStore:
    """Layers and merged roots of one server under `state_dir`."""

    def __init__(self, state_dir: str | os.PathLike) -> None:
        self.state = Path(state_dir)
        self.layers = self.state / "layers"
        self.roots = self.state / "roots"
        for d in (self.state, self.layers, self.roots):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)  # the sandbox's user walks through to its own root
        self.empty = self.layers / "empty"
        self.empty.mkdir(exist_ok=True)
        self._why_not: str | None | bool = False  # False: not probed yet
        self._idmap_why_not: str | None | bool = False

    @property
    def why_not(self) -> str | None:
        """None when layers work here, else why not (probed once, on first use, with
        `idmap_why_not`)."""
        if self._why_not is False:
            self._why_not = probe(self.layers)
            self._idmap_why_not = self._why_not or self._probe_idmap()
            if self._why_not is None and self._idmap_why_not is not None:
                log.warning(
                    "layers are not idmapped (%s): a fork's children and a snapshot's "
                    "environments run as the uid of the environment they came from",
                    self._idmap_why_not,
                )
        return self._why_not  # type: ignore[return-value]

    # -- crash safety ----------------------------------------------------------------------------
    def sweep(self) -> list[str]:
        """Unmount and remove what dead servers left under `roots/` and `layers/` (merged
        roots first, then the layers below them)."""
        swept = []
        for folder in (self.roots, self.layers):
            for p in sorted(folder.iterdir()):
                pid = dead_owner(p.name)
                if pid is None:
                    continue
                unmount_below(p)
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                swept.append(f"{p} (server pid {pid})")
        return swept

    @property
    def idmapped(self) -> bool:
        """Whether every environment's layers are mounted idmapped to its own uid (probed once,
        on first use; `idmap_why_not` says why not)."""
        return self.idmap_why_not is None

    @property
    def idmap_why_not(self) -> str | None:
        self.why_not  # noqa: B018 (probes both once)
        return self._idmap_why_not  # type: ignore[return-value]

    def _probe_idmap(self) -> str | None:
        """None when a file chowned to a trial uid through an idmapped writable layer is
        stored as `idmap.LAYER_OWNER` (the path every layered environment's mount takes)."""
        trial = idmap.LAYER_OWNER - 1
        target = self.roots / owned_name(f"probe-{uuid.uuid4().hex[:6]}")
        try:
            upper = self.new_layer(MIN_DISK_MB)
        except TangramError as exc:
            return f"no trial layer: {exc}"
        try:
            target.mkdir(mode=0o755)
            self._mount_idmapped(Stack(str(self.empty)), upper, target, trial)
            (target / "f").touch()
            os.chown(target / "f", trial, trial)
            seen, kept = (target / "f").stat().st_uid, (upper.upper / "f").stat().st_uid
            if (seen, kept) != (trial, idmap.LAYER_OWNER):
                return f"an idmapped layer kept uid {kept} (shown as {seen})"
            return None
        except (OSError, TangramError) as exc:
            return f"this kernel refuses idmapped overlay layers (Linux >= 5.19): {exc}"
        finally:
            self.unmount(target)
            self.drop(upper)

    def require(self) -> None:
        if self.why_not is not None:
            raise BackendUnavailable(self.why_not)

    # -- layers ----------------------------------------------------------------------------------
    def new_layer(self, disk_mb: int) -> Layer:
        """A fresh writable layer: its own ext4 of `disk_mb` MiB, loop-mounted."""
        self.require()
        lid = owned_name(uuid.uuid4().hex[:8])
        path = self.layers / lid
        path.mkdir(mode=0o755)
        layer = Layer(lid, path, disk_mb)
        try:
            img = path / "disk.img"
            _run(
                ["cp", "--sparse=always", str(self._template(disk_mb)), str(img)],
                f"making the disk of layer {lid}",
            )
            layer.fs.mkdir()
            _run(
                ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(img), str(layer.fs)],
                f"mounting the disk of layer {lid}",
            )
            layer.upper.mkdir()
            layer.work.mkdir()
        except BaseException:
            self.drop(layer)
            raise
        return layer

    def _template(self, disk_mb: int) -> Path:
        """A freshly formatted empty disk of `disk_mb` MiB, made once per size and copied
        (sparse: a few hundred KiB) for each new layer: ~5 ms where mkfs takes ~100."""
        template = self.layers / f"template-{disk_mb}.img"
        if not template.exists():
            tmp = self.layers / owned_name(f"template-{uuid.uuid4().hex[:6]}.img")
            try:
                with open(tmp, "wb") as f:
                    f.truncate(disk_mb << 20)
                _run([*MKFS, str(tmp)], f"formatting a {disk_mb} MiB disk")
                os.replace(tmp, template)
            finally:
                tmp.unlink(missing_ok=True)
        return template

    def drop(self, layer: Layer) -> None:
        """Unmount a layer's disk and delete it (its loop device is freed with it)."""
        unmount_below(layer.path)
        shutil.rmtree(layer.path, ignore_errors=True)

    def hold(self, stack: Stack) -> None:
        for layer in stack.layers:
            layer.refs += 1

    def release(self, stack: Stack) -> list[Layer]:
        """One stack fewer on these layers; a frozen layer nobody stacks on is dropped (and
        returned)."""
        dropped = []
        for layer in stack.layers:
            layer.refs -= 1
            if layer.refs <= 0:
                self.drop(layer)
                dropped.append(layer)
        return dropped

    # -- merged roots ----------------------------------------------------------------------------
    def target_for(self, env_id: str) -> Path:
        return self.roots / owned_name(env_id)

    def mount(self, stack: Stack, upper: Layer, target: Path, uid: int | None = None) -> None:
        """Mount the overlay of `stack` under `upper` at `target` (created); with `uid` (the
        environment's, where it has one) and idmapped layers (`idmapped`), every layer through
        a clone idmapped to it (see `idmap`)."""
        target.mkdir(mode=0o755, exist_ok=True)
        if uid is None or not self.idmapped:
            lowers = [layer.upper for layer in stack.layers]
            self._overlay(target, [*lowers, Path(stack.base)], upper.upper, upper.work)
        else:
            self._mount_idmapped(stack, upper, target, uid)

    def _mount_idmapped(self, stack: Stack, upper: Layer, target: Path, uid: int) -> None:
        """The overlay over idmapped clones of its layers' disks, attached under a folder of
        their own only while it is mounted (overlayfs keeps private clones)."""
        clones = self.layers / owned_name(f"ids-{uuid.uuid4().hex[:8]}")
        clones.mkdir(mode=0o700)
        attached: list[Path] = []
        try:
            ns = idmap.userns(uid)
            try:
                for i, layer in enumerate((upper, *stack.layers)):
                    point = clones / str(i)
                    point.mkdir()
                    idmap.attach(layer.fs, point, ns)
                    attached.append(point)
            finally:
                os.close(ns)
            lowers = [p / "upper" for p in attached[1:]]
            self._overlay(
                target, [*lowers, Path(stack.base)], clones / "0/upper", clones / "0/work"
            )
        except OSError as exc:
            raise TangramError(f"idmapping the layers of the root {target.name}: {exc}") from exc
        finally:
            for point in attached:
                with contextlib.suppress(OSError):
                    idmap.detach(point)
            for point in (*(clones / str(i) for i in range(len(stack.layers) + 1)), clones):
                with contextlib.suppress(OSError):
                    point.rmdir()  # never rmtree: a clone that did not detach holds a layer

    def _overlay(self, target: Path, lowers: list[Path], upper: Path, work: Path) -> None:
        rel = lambda p: os.path.relpath(p, self.layers)  # short: the options fit in a page
        options = (
            f"lowerdir={':'.join(map(rel, lowers))},upperdir={rel(upper)},"
            f"workdir={rel(work)},volatile,index=off"
        )
        if len(options) > 4000:
            raise TangramError(
                f"the layer stack of {target.name} is {len(lowers) - 1} deep: "
                f"too deep to mount (fork from a snapshot nearer the image)"
            )
        _run(
            ["mount", "-t", "overlay", "overlay", "-o", f"nosuid,nodev,{options}", str(target)],
            f"mounting the root {target.name}",
            cwd=self.layers,
        )

    def unmount(self, target: Path) -> None:
        unmount_below(target)
        with contextlib.suppress(OSError):
            target.rmdir()

    # -- figures ---------------------------------------------------------------------------------
    @staticmethod
    def allocated_mb(layer: Layer) -> int:
        """MiB of host disk the layer takes (its sparse file's blocks)."""
        try:
            return -(-os.stat(layer.path / "disk.img").st_blocks * 512 // (1 << 20))
        except OSError:
            return 0

    @staticmethod
    def full(layer: Layer) -> bool:
        """Whether the layer's disk is (nearly) out of blocks or inodes."""
        try:
            st = os.statvfs(layer.fs)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < FULL_BYTES or st.f_favail == 0


def probe(folder: Path) -> str | None:
    """None when overlayfs and loop-mounted ext4 work under `folder`, else why not."""
    if os.geteuid() != 0:  # (first: a missing tool is not what stops an unprivileged server)
        return (
            f"images, disk bounds and forks need root (overlayfs on loop devices; this server "
            f"runs as uid {os.geteuid()}: docs/rootless.md)"
        )
    missing = [t for t in ("mount", "umount", MKFS[0]) if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found: install util-linux and e2fsprogs"
    trial = folder / owned_name(f"probe-{uuid.uuid4().hex[:6]}")
    try:
        (trial / "lower").mkdir(parents=True)
        for d in ("upper", "work", "merged"):
            (trial / d).mkdir()
        try:
            _run(
                [
                    "mount",
                    "-t",
                    "overlay",
                    "overlay",
                    "-o",
                    "lowerdir=lower,upperdir=upper,workdir=work,volatile,index=off",
                    "merged",
                ],
                "overlayfs",
                cwd=trial,
            )
        except TangramError as exc:
            return f"this kernel refuses overlayfs with volatile (Linux >= 5.10, root): {exc}"
        unmount_below(trial / "merged")
        img = trial / "d.img"
        with open(img, "wb") as f:
            f.truncate(MIN_DISK_MB << 20)
        try:
            _run([*MKFS, str(img)], "mkfs.ext4")
            _run(
                ["mount", "-t", "ext4", "-o", "loop", str(img), str(trial / "merged")],
                "a loop mount",
            )
        except TangramError as exc:
            return f"cannot loop-mount an ext4 disk (is /dev/loop-control there?): {exc}"
        unmount_below(trial / "merged")
        return None
    finally:
        unmount_below(trial)
        shutil.rmtree(trial, ignore_errors=True)


def mounts_below(folder: Path) -> list[str]:
    """Mount points at or below `folder` in this mount namespace, deepest first."""
    prefix = str(folder.resolve() if folder.exists() else folder)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].encode().decode("unicode_escape")
                if point == prefix or point.startswith(prefix + "/"):
                    found.append(point)
    except OSError:
        return []
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_below(folder: Path) -> None:
    """Unmount everything at or below `folder` (lazily when busy: still-running holders of a
    dead sandbox let go when they die)."""
    for point in mounts_below(folder):
        done = subprocess.run(["umount", point], capture_output=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TangramError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise TangramError(f"{what}: {(done.stderr or done.stdout).strip()[-500:]}")
