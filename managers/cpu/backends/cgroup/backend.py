"""The `cgroup` backend: one cgroup per environment, cpuset and quota rewritten per exec (root).

Each exec takes a free slot cgroup of its environment (slots are reused, so concurrent execs of
one trajectory are confined separately and an exec costs two small writes at most: cpuset.cpus
and the quota, each skipped when unchanged). The command joins the slot before it starts (the
shell that runs it writes 0 to the slot's cgroup.procs), so every descendant is confined from
its first instruction. After the command exits, whatever is left in the slot is killed.

Limits per environment: memory (what the environment was opened with) and processes (`pids_max`,
default `DEFAULT_PIDS_MAX`, where the pids controller exists), named in a failed command's
result by the family's one rule (`base.name_limits`). Commands see only `grant.command_env`;
GPUs granted to an exec are named in its variables only (`CUDA_VISIBLE_DEVICES`,
`TANGRAM_GPUS`): this backend does not isolate devices, every GPU stays reachable.

This backend confines CPU and memory but does not isolate: the command runs as the server's user
in the host's namespaces. `bwrap` builds its sandbox on top of this one (`_launch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from managers.cpu.backends.base import (
    DEFAULT_PIDS_MAX,
    Backend,
    EnvironmentBroken,
    LimitCounts,
    NotStarted,
    Sandbox,
    check_pids_max,
)
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.limits import raise_if_out_of_files
from managers.cpu.backends.process import run_local
from managers.cpu.environments import Environment
from managers.cpu.mounts import remove_folder
from managers.cpu.request import Command, ExecSpec
from tangram.errors import BackendUnavailable, ValidationError
from tangram.results import Result

log = logging.getLogger(__name__)
SLOT_CONTROLLERS = ("cpu", "cpuacct", "cpuset")
REMOVE_TRIES = 50  # x 10 ms: how long a removal waits for descriptors to come back
JOIN_FAILED = "tangram: cannot join the cgroup of this exec"


@dataclass(slots=True)
class Slot:
    folders: dict[str, Path]  # controller -> the slot folder
    join: str  # shell line moving the shell into the slot (and the env's memory cgroup, v1)
    procs: tuple[Path, ...] = ()  # the cgroup.procs files that `join` writes
    cpus: str = ""
    quota: str = ""


@dataclass(slots=True)
class EnvCgroups:
    """An environment's cgroups: its folder per controller and its exec slots below them
    (`free`: those no exec holds now)."""

    folders: dict[str, Path]
    free: list[Slot] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    # a new slot is made on the loop (an exec's) and in threads (the holder's, a tar's, a
    # session's): one at a time, so no two are given the same name
    making: threading.Lock = field(default_factory=threading.Lock)


class CgroupBackend(Backend):
    name = "cgroup"

    def __init__(
        self,
        parent: str | None = None,
        pids_max: int = DEFAULT_PIDS_MAX,
        favor_dynmods: bool = True,
    ) -> None:
        """Checks its options only: the hierarchy is found at `start`. `favor_dynmods`: set
        the kernel's `favordynmods` cgroup option at start (`cgroupfs.favor_dynmods`: a
        host-wide setting that makes each exec's move into its cgroup ~0.3 ms instead of up
        to an RCU grace period); False leaves the host's mounts as they are."""
        super().__init__()
        if not isinstance(favor_dynmods, bool):
            raise ValidationError("cpu.favor_dynmods", favor_dynmods, "must be true or false")
        self.favor_dynmods = favor_dynmods
        self.pids_max = check_pids_max(pids_max)
        self.parent = parent
        self._h: fs.Hierarchy | None = None
        self._made_bases = False
        self._workdirs: set[str] = set()
        self._finalizer: weakref.finalize | None = None

    @property
    def h(self) -> fs.Hierarchy:
        """Where Tangram's cgroups live (found at `start`)."""
        if self._h is None:
            raise NotStarted(
                f"the {self.name} backend has no cgroups before it is started: "
                f"await its start() (CpuManager.start does) first"
            )
        return self._h

    def _start(self) -> None:
        super()._start()
        self._h = fs.detect(self.tag, self.parent)
        if self.favor_dynmods:
            log.info("cgroup: %s", fs.favor_dynmods())
        if not self._h.pids:
            log.warning("cgroup: no pids controller; environments have no process limit")
        # a manager never closed still leaves no cgroup behind when the interpreter exits
        self._finalizer = weakref.finalize(self, _remove_bases, self._h.distinct(), self._workdirs)

    @classmethod
    def probe(cls) -> str | None:
        try:
            h = fs.detect("probe")
        except BackendUnavailable as exc:
            return str(exc)
        parent = h.base("cpuset").parent
        if not os.access(parent, os.W_OK):
            return f"cannot write to {parent}: run as root with cgroupfs mounted read-write"
        return None

    def describe(self) -> str:
        if self._h is None:
            return f"{self.name} (not started)"
        return f"cgroup (v{self._h.version}, under {self._h.base('cpu').parent})"

    def _sweep(self) -> list[str]:
        return fs.sweep(self.h)

    # -- layout --------------------------------------------------------------------------------

    def _ensure_bases(self) -> None:
        if self._made_bases:
            return
        try:
            for base in self.h.distinct():
                base.mkdir(exist_ok=True)
            if self.h.version == 1:
                cs = self.h.base("cpuset")
                for name in ("cpuset.cpus", "cpuset.mems"):
                    fs.write(cs / name, fs.read(cs.parent / name))
            else:
                self._enable_v2(self.h.base("cpu").parent)
                self._enable_v2(self.h.base("cpu"))
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot create Tangram's cgroup under {self.h.base('cpu').parent} ({exc}): run "
                f"as root with the cgroup filesystem writable; on cgroup v2 set "
                f"TANGRAM_CGROUP_PARENT to a delegated cgroup with cpu, cpuset and memory "
                f"enabled in its cgroup.subtree_control, {fs.FIX}"
            ) from exc
        self._made_bases = True

    def _enable_v2(self, folder: Path) -> None:
        have = set(fs.read(folder / "cgroup.subtree_control").split())
        wanted = (*fs.V2_CONTROLLERS, *([fs.OPTIONAL] if self.h.pids else []))
        need = [c for c in wanted if c not in have]
        if need:
            fs.write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in need))

    def _env_folders(self, env_id: str) -> dict[str, Path]:
        return {c: b / env_id for c, b in self.h.bases.items()}

    async def _open(self, env: Environment, cores: tuple[int, ...]) -> CgroupSandbox:
        cgroups = self._make_cgroups(env, cores)
        self._workdirs.add(env.workdir)
        self._make_workdir(env)
        return CgroupSandbox(self, env, cgroups)

    def _make_cgroups(self, env: Environment, cores: tuple[int, ...]) -> EnvCgroups:
        """The environment's cgroups, limited to its memory and `pids_max`, all of `cores`
        allowed; raises `BackendUnavailable` (nothing left behind) where they cannot be made."""
        self._ensure_bases()
        folders = self._env_folders(env.id)
        try:
            for f in {p for p in folders.values()}:
                f.mkdir()
            if self.h.version == 1:
                cs = folders["cpuset"]
                fs.write(cs / "cpuset.cpus", fs.cpulist(cores))
                fs.write(cs / "cpuset.mems", fs.read(cs.parent / "cpuset.mems"))
                fs.write(folders["memory"] / "memory.limit_in_bytes", str(env.memory_mb << 20))
            else:
                f = folders["cpu"]
                fs.write(f / "cpuset.cpus", fs.cpulist(cores))
                fs.write(f / "memory.max", str(env.memory_mb << 20))
                if (f / "memory.swap.max").exists():  # the limit is memory, not memory + swap
                    fs.write(f / "memory.swap.max", "0")
                self._enable_v2(f)
            if self.h.pids:
                fs.write(folders["pids"] / "pids.max", str(self.pids_max))
        except OSError as exc:
            self._remove(folders)
            raise_if_out_of_files(exc)  # a host limit (503), not a broken cgroup filesystem
            raise BackendUnavailable(
                f"cannot create the cgroup of environment {env.id} "
                f"({exc}); is the cgroup filesystem writable?"
            ) from exc
        return EnvCgroups(folders)

    def _slot(self, e: EnvCgroups) -> Slot:
        with e.making:
            if e.free:
                return e.free.pop()
            slot = self._new_slot(e, f"x{len(e.slots)}")
            e.slots.append(slot)
            return slot

    def _new_slot(self, e: EnvCgroups, name: str) -> Slot:
        if self.h.version == 1:
            folders = {c: e.folders[c] / name for c in SLOT_CONTROLLERS}
            for f in dict.fromkeys(folders.values()):
                f.mkdir()
            mems = fs.read(e.folders["cpuset"] / "cpuset.mems")
            fs.write(folders["cpuset"] / "cpuset.mems", mems)
            joins = [
                *dict.fromkeys(folders.values()),
                e.folders["memory"],
                *([e.folders["pids"]] if "pids" in e.folders else []),
            ]
        else:
            f = e.folders["cpu"] / name
            f.mkdir()
            folders = {c: f for c in SLOT_CONTROLLERS}
            joins = [f]
        writes = " && ".join(f"echo 0 >{shlex.quote(str(j / 'cgroup.procs'))}" for j in joins)
        return Slot(
            folders,
            f"{{ {writes}; }} 2>/dev/null || {{ echo '{JOIN_FAILED}' >&2; exit 125; }}",
            tuple(j / "cgroup.procs" for j in joins),
        )

    def _confine(self, slot: Slot, cores: tuple[int, ...], share: float | None = None) -> None:
        """Confine the slot to `cores` (a quota of all of them, or of `share` of one core)."""
        slot.cpus, slot.quota = fs.set_cores(
            self.h.version, slot.folders, cores, (slot.cpus, slot.quota), share
        )

    def cpu_seconds(self, env_id: str) -> float:
        """CPU time used by everything that ran in the environment (from the cgroup)."""
        folders = self._env_folders(env_id)
        if self.h.version == 1:
            return int(fs.read(folders["cpuacct"] / "cpuacct.usage")) / 1e9
        for line in fs.read(folders["cpu"] / "cpu.stat").splitlines():
            k, v = line.split()
            if k == "usage_usec":
                return int(v) / 1e6
        return 0.0

    def folders(self, env_id: str) -> list[Path]:
        """Every cgroup folder of an environment (for leak checks)."""
        return list(dict.fromkeys(self._env_folders(env_id).values()))

    def _remove(self, folders: dict[str, Path]) -> None:
        """Remove each cgroup tree. Walking a tree takes a descriptor: where the server has run
        out of them (EMFILE, the very error an open may be cleaning up after), it retries while
        they come back, then logs and leaves the tree to the next server's sweep, so the error
        being handled is the one the caller sees."""
        for top in dict.fromkeys(folders.values()):
            for attempt in range(REMOVE_TRIES):
                try:
                    if top.is_dir():
                        fs.remove_tree(top)
                    break
                except OSError as exc:
                    if attempt == REMOVE_TRIES - 1:
                        log.warning("could not remove cgroup %s (%s): left to the sweep", top, exc)
                    else:
                        time.sleep(0.01)

    async def _shutdown(self) -> None:
        if self._finalizer is not None:
            await asyncio.to_thread(self._finalizer)
        self._made_bases = False


class CgroupSandbox(Sandbox):
    """An environment of the cgroup backend: its cgroups (`cgroups`) and its work folder.
    An exec takes a free slot, confines it to its cores and runs the command joined to it
    (`_launch`, `_start`: the hooks an isolating backend's sandbox fills in)."""

    backend: CgroupBackend

    def __init__(self, backend: CgroupBackend, env: Environment, cgroups: EnvCgroups) -> None:
        super().__init__(backend, env)
        self.cgroups = cgroups

    def _gone(self) -> bool:
        return not self.cgroups.folders["cpu"].is_dir()

    async def _run(self, spec: ExecSpec) -> Result:
        b, e, env = self.backend, self.cgroups, self.env
        if self._gone():
            raise EnvironmentBroken(
                f"environment {env.id} is broken: its cgroup {e.folders['cpu']} is gone"
            )
        try:
            slot = b._slot(e)
            b._confine(slot, spec.cores)
        except OSError as exc:
            raise EnvironmentBroken(
                f"environment {env.id} is broken: cannot set its cgroup "
                f"to cores {fs.cpulist(spec.cores)} ({exc})"
            ) from exc
        fds: tuple[int, ...] = ()
        try:
            fds = self._entry(spec)  # before `_start`, whose `_launch` names them
            outcome = await self._start(slot, spec, fds)
        finally:
            self._entry_done(fds)
            e.free.append(slot)
        if outcome.exit_code == 125 and JOIN_FAILED in outcome.stderr:
            raise EnvironmentBroken(
                f"environment {env.id} is broken: the command could not join its cgroup "
                f"{slot.folders['cpu']}"
            )
        return outcome

    def _entry(self, spec: ExecSpec) -> tuple[int, ...]:
        """File descriptors the exec's launcher needs open (none here), opened per exec and
        handed to `_launch`."""
        return ()

    def _entry_done(self, fds: tuple[int, ...]) -> None:
        """Close what `_entry` opened, once the exec is over."""

    async def _start(self, slot: Slot, spec: ExecSpec, fds: tuple[int, ...]) -> Result:
        """Run one command in `slot` (joined before it starts), its leftovers killed; `fds`
        (from `_entry`) are passed to it."""
        leaf = slot.folders["cpu"]
        return await run_local(
            self._launch(slot.join, spec, fds),
            cwd=self.launch_cwd,
            env=self.environ(spec),
            timeout=spec.timeout,
            output_cap=spec.output_cap,
            kill_rest=lambda: fs.kill_all(leaf),
            pass_fds=fds,
        )

    def _launch(self, join: str, spec: ExecSpec, fds: tuple[int, ...]) -> list[str]:
        """The argv of one exec: a shell that joins the slot (`join`), then runs the command.
        An isolating backend's sandbox puts itself between the two (with `spec.gpus`'
        devices), entering through `fds`."""
        return joined(join, spec.command)

    def _limit_counts(self) -> LimitCounts:
        folders = self.cgroups.folders
        return LimitCounts(
            fs.oom_kills(self.backend.h.version, folders["memory"]),
            fs.pids_refused(folders.get("pids")),
        )

    async def _serve_launch(
        self, argv: list[str], cap: int
    ) -> tuple[list[str], tuple[int, ...], Callable[[], None]]:
        """In a cgroup slot of the environment of its own (so its CPU time, memory and
        processes are the environment's, within its limits), on one core of the environment's
        set; the slot's leftovers are killed and the slot freed once it is over."""
        b, e, env = self.backend, self.cgroups, self.env
        if self._gone():
            raise EnvironmentBroken(f"environment {env.id} is broken: its cgroup is gone")
        top = e.folders["cpuset" if b.h.version == 1 else "cpu"]
        try:
            core = int(fs.read(top / "cpuset.cpus").split(",")[0].split("-")[0])
            slot = await asyncio.to_thread(b._slot, e)
            b._confine(slot, (core,))
        except (OSError, ValueError) as exc:
            raise EnvironmentBroken(
                f"environment {env.id} is broken: cannot make a cgroup slot in {top} ({exc})"
            ) from exc

        try:
            argv, fds, entered_done = self._serve_enter(slot.join, argv, cap)
        except BaseException:
            e.free.append(slot)
            raise

        def done() -> None:
            try:
                entered_done()
            finally:
                fs.kill_all(slot.folders["cpu"])
                e.free.append(slot)

        return argv, fds, done

    def _serve_enter(
        self, join: str, argv: list[str], cap: int
    ) -> tuple[list[str], tuple[int, ...], Callable[[], None]]:
        """The argv that joins the slot (`join`) and runs `argv`; an isolating backend's
        sandbox puts itself between the two."""
        return joined(join, argv), (), lambda: None

    def cpu_seconds(self) -> float:
        return self.backend.cpu_seconds(self.env.id)

    async def _remove_workdir(self) -> list[str]:
        """Remove the work folder (what is left: `Backend._remove_workdir`)."""
        return await self.backend._remove_workdir(self.env)

    async def suspend(self) -> None:
        for slot in self.cgroups.slots:
            await asyncio.to_thread(fs.kill_all, slot.folders["cpu"])

    async def _close(self) -> None:
        """Kill and remove the cgroups, then the work folder. What cannot be removed is logged
        and left to the next server's sweep; the rest is released whatever happens."""
        b, env = self.backend, self.env
        try:
            await asyncio.to_thread(b._remove, self.cgroups.folders)
        finally:
            left = await self._remove_workdir()
            b._workdirs.discard(env.workdir)
            if left:
                log.warning("environment %s: could not remove %s", env.id, "; ".join(left))


def _remove_bases(bases: list[Path], workdirs: set[str]) -> None:
    """Kill what is left under Tangram's folders and remove them, deepest first; remove the
    environments' working directories (and what is mounted there: `bwrap.views`)."""
    for base in bases:
        if base.is_dir():
            fs.remove_tree(base)
    for w in list(workdirs):
        left = remove_folder(w)
        if left:
            log.warning("could not remove %s", "; ".join(left))


def joined(join: str, command: Command, detached: bool = False) -> list[str]:
    """The shell joins the slot first, so the command and all its descendants start confined
    (a shell string runs in that same shell; an argv is exec'd by it). `detached`: the argv
    runs in the background with no standard streams and the shell exits at once (the command
    is then no child of the caller's: it lives in its slot until the slot is killed)."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", f"{join}\n{command}"]
    if detached:
        return ["/bin/sh", "-c", f'{join}\n"$@" </dev/null >/dev/null 2>&1 &', "sh", *command]
    return ["/bin/sh", "-c", f'{join}\nexec "$@"', "sh", *command]
