"""Environments' own trees: images under private layers, forks, snapshots, files in and out.

`Roots` is the CPU manager's bookkeeping over `layers.LayerStore` and `images.ImageStore`: the
snapshots and what they hold, and the disk they take on the node; each environment's own tree
(its `layers.Rooted`, the image pin) is on its record (`environments.EnvRecord`). It does
the host-side work only (mount, freeze, unmount, files); the manager stops and restarts the
sandbox around it (`Sandbox.suspend` / `resume`).

Paths of the files API: with an image, an absolute path is the environment's own root (`/etc/x`
is the image's `/etc/x` as the environment sees it) and a relative one is under its work folder
`/sandbox`; without an image, paths are under the work folder (`/sandbox/x` or `x`) and any
other absolute path is refused: such an environment has no root of its own.
"""

from __future__ import annotations

import os
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from managers.cpu.images import ImageStore
from managers.cpu.layers import DEFAULT_DISK_MB, MIN_DISK_MB, Layer, LayerStore, Rooted, Stack
from tangram.errors import NotFound, ValidationError

INSIDE_WORK = "/sandbox"
MAX_DISK_MB = 1 << 24


@dataclass(eq=False, slots=True)
class Snapshot:
    """A frozen stack kept under an id: `open_env(snapshot=id)` starts from it."""

    id: str
    stack: Stack
    uid: int | None
    node: str
    created: float
    pin: int | None = None  # the image pin (see `ImageStore.pin`)
    source_env: str = ""

    def to_dict(self, mb: int) -> dict:
        return {
            "snapshot_id": self.id,
            "image": self.stack.image,
            "node": self.node,
            "layers": len(self.stack.layers),
            "disk_mb": mb,
            "created": self.created,
            "env_id": self.source_env,
        }


@dataclass(eq=False, slots=True)
class Prepared:
    """What `Roots.prepare` made for a new environment: its mounted tree and where it sits."""

    rooted: Rooted
    root: str | None  # Environment.root
    workdir: str  # Environment.workdir
    pin: int | None = None
    dropped: list[Layer] = field(default_factory=list)


class Roots:
    """The trees of one CPU manager's environments under `state_dir`."""

    def __init__(
        self, state_dir: str | os.PathLike, default_disk_mb: int = DEFAULT_DISK_MB
    ) -> None:
        self.check_disk_mb(default_disk_mb)
        self.state = Path(state_dir)
        self.layers = LayerStore(self.state)
        self.images = ImageStore(self.state / "images")
        self.default_disk_mb = default_disk_mb
        self.snapshots: dict[str, Snapshot] = {}

    @staticmethod
    def check_disk_mb(value: object) -> None:
        """The manager's default disk bound of an environment (MiB), checked one way."""
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not MIN_DISK_MB <= value <= MAX_DISK_MB
        ):
            raise ValidationError(
                "cpu.disk_mb",
                value,
                f"must be an integer from {MIN_DISK_MB} to {MAX_DISK_MB} (MiB)",
            )

    def sweep(self) -> list[str]:
        return self.layers.sweep() + self.images.sweep()

    # -- opening ---------------------------------------------------------------------------------
    def disk_of(self, disk_mb: int | None) -> int:
        disk = self.default_disk_mb if disk_mb is None else disk_mb
        if (
            isinstance(disk, bool)
            or not isinstance(disk, int)
            or not MIN_DISK_MB <= disk <= MAX_DISK_MB
        ):
            raise ValidationError(
                "env.disk_mb",
                disk_mb,
                f"must be an integer from {MIN_DISK_MB} to {MAX_DISK_MB} (MiB)",
            )
        return disk

    def stack_for(self, image: str | None, snapshot: str | None) -> tuple[Stack, int | None]:
        """The stack a new environment starts from, and the uid it must run as (None: a fresh
        one; a snapshot's source's only where layers are not idmapped, see `inherited_uid`)."""
        if image is not None and snapshot is not None:
            raise ValidationError(
                "env.snapshot",
                snapshot,
                "give an image or a snapshot, not both (a snapshot has its image)",
            )
        self.layers.require()
        if snapshot is not None:
            snap = self.snapshot(snapshot)
            return snap.stack, self.inherited_uid(snap.uid)
        if image is not None:
            img = self.images.resolve(image, "env.image")
            return Stack(img.rootfs, (), img.digest), None
        return Stack(str(self.layers.empty)), None

    def inherited_uid(self, uid: int | None) -> int | None:
        """The uid an environment made from the files of one that ran as `uid` (a fork child,
        an environment from a snapshot) must run as: a fresh one (None) where layers are
        idmapped (`LayerStore.idmapped`: the inherited files show as its own), else `uid` (the
        files on disk are that uid's)."""
        return None if self.layers.idmapped else uid

    def prepare(self, env_id: str, stack: Stack, disk_mb: int, uid: int | None) -> Prepared:
        """Make the environment's writable layer and mount its tree, idmapped to `uid` where
        the backend gives the environment one (blocking: run it in a thread)."""
        pin = self.images.pin(stack.image) if stack.image else None
        upper = None
        target = self.layers.target_for(env_id)
        try:
            upper = self.layers.new_layer(disk_mb)
            self.layers.mount(stack, upper, target, uid)
            if stack.image is not None:
                for name, mode in (("tmp", 0o1777), (INSIDE_WORK.strip("/"), 0o700)):
                    p = target / name
                    p.mkdir(exist_ok=True)
                    os.chmod(p, mode)
        except BaseException:
            if upper is not None:
                self.layers.unmount(target)
                self.layers.drop(upper)
            if pin is not None:
                self.images.unpin(pin)
            raise
        self.layers.hold(stack)
        rooted = Rooted(stack, upper, target, uid)
        if stack.image is None:
            return Prepared(rooted, None, str(target), pin)
        return Prepared(rooted, str(target), str(target / INSIDE_WORK.strip("/")), pin)

    def discard(self, rooted: Rooted, pin: int | None) -> list[Layer]:
        """Unmount an environment's tree, drop its writable layer, release its stack and its
        image pin; returns the frozen layers that went with it (blocking)."""
        self.layers.unmount(rooted.target)
        self.layers.drop(rooted.upper)
        dropped = self.layers.release(rooted.stack)
        if pin is not None:
            self.images.unpin(pin)
        return dropped

    # -- freezing --------------------------------------------------------------------------------
    @staticmethod
    def rooted(env_id: str, rooted: Rooted | None, what: str) -> Rooted:
        """The environment's tree, or the refusal of `what` (fork, snapshot) without one."""
        if rooted is None:
            raise ValidationError(
                "env_id",
                env_id,
                f"this environment was opened without "
                f"image, disk_mb or snapshot: it has no layer to {what} (open "
                f"it with disk_mb=... or an image)",
            )
        return rooted

    def freeze(self, rooted: Rooted, disk_mb: int) -> Layer:
        """Freeze the environment's writable layer where it lies and remount its tree with a
        fresh one on top: O(1) in the data written (blocking; the sandbox must be stopped).
        Returns the frozen layer (its disk is to be counted on the node)."""
        fresh = self.layers.new_layer(disk_mb)
        old = rooted.upper
        stack = rooted.stack.on(old)
        # the tree's top folder shows its upper layer's: a fresh one is root's, 0755 (the work
        # folder of an environment without an image, handed to its user at open)
        top = os.stat(rooted.target)
        try:
            self.layers.unmount(rooted.target)
            self.layers.mount(stack, fresh, rooted.target, rooted.uid)
        except BaseException:
            self.layers.drop(fresh)
            self.layers.mount(rooted.stack, old, rooted.target, rooted.uid)
            raise
        os.chown(rooted.target, top.st_uid, top.st_gid)
        os.chmod(rooted.target, stat.S_IMODE(top.st_mode))
        self.layers.hold(stack)
        self.layers.release(rooted.stack)  # the same layers again, one ref each: none dropped
        rooted.stack, rooted.upper = stack, fresh
        return old

    def keep(self, rooted: Rooted, env_id: str, node: str) -> Snapshot:
        """Keep the environment's current stack (just frozen) as a snapshot."""
        uid = rooted.uid
        sid = f"snap-{uuid.uuid4().hex[:12]}"
        self.layers.hold(rooted.stack)
        pin = self.images.pin(rooted.stack.image) if rooted.stack.image else None
        snap = Snapshot(sid, rooted.stack, uid, node, time.time(), pin, env_id)
        self.snapshots[sid] = snap
        return snap

    def snapshot(self, snapshot_id: str) -> Snapshot:
        snap = self.snapshots.get(snapshot_id) if isinstance(snapshot_id, str) else None
        if snap is None:
            raise NotFound(
                "snapshot",
                snapshot_id,
                "no such snapshot (snapshots do not survive a restart of the server)",
            )
        return snap

    def delete(self, snapshot_id: str) -> list[Layer]:
        snap = self.snapshot(snapshot_id)
        del self.snapshots[snapshot_id]
        dropped = self.layers.release(snap.stack)
        if snap.pin is not None:
            self.images.unpin(snap.pin)
        return dropped

    def snapshot_mb(self, snap: Snapshot) -> int:
        return sum(layer.counted_mb for layer in snap.stack.layers)

    # -- files -----------------------------------------------------------------------------------
    @staticmethod
    def inside(root: str | None, workdir: str, path: str) -> tuple[str, str]:
        """(the host folder to resolve in, the path relative to it) for a files-API path."""
        if not isinstance(path, str):
            raise ValidationError("files", path, "a path must be a string")
        if root is not None:
            if path.startswith("/"):
                return root, path.lstrip("/")
            return root, f"{INSIDE_WORK.strip('/')}/{path}"
        if path.startswith("/"):
            if path != INSIDE_WORK and not path.startswith(INSIDE_WORK + "/"):
                raise ValidationError(
                    "files",
                    path,
                    f"this environment has no root of its own "
                    f"(opened without an image): give a path under "
                    f"{INSIDE_WORK} or a relative one",
                )
            return workdir, path[len(INSIDE_WORK) :].lstrip("/")
        return workdir, path
