"""The `cgroup` backend: one cgroup per environment, cpuset and quota rewritten per exec (root).

Each exec takes a free slot cgroup of its environment (slots are reused, so concurrent execs of
one trajectory are confined separately and an exec costs two small writes at most: cpuset.cpus
and the quota, each skipped when unchanged). The command joins the slot before it starts (the
shell that runs it writes 0 to the slot's cgroup.procs), so every descendant is confined from
its first instruction. After the command exits, whatever is left in the slot is killed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from managers.base import Outcome
from managers.cpu.backends import cgroupfs as fs
from managers.cpu.backends.base import Backend, EnvironmentBroken, register
from managers.cpu.backends.process import run_local
from managers.cpu.pool import Environment
from managers.cpu.request import Command
from tangram.errors import BackendUnavailable

log = logging.getLogger(__name__)
SLOT_CONTROLLERS = ("cpu", "cpuacct", "cpuset")
JOIN_FAILED = "tangram: cannot join the cgroup of this exec"


@dataclass(slots=True)
class _Slot:
    folders: dict[str, Path]  # controller -> the slot folder
    join: str  # shell line moving the shell into the slot (and the env's memory cgroup, v1)
    cpus: str = ""
    quota: str = ""


@dataclass(slots=True)
class _Env:
    folders: dict[str, Path]
    free: list[_Slot] = field(default_factory=list)
    slots: list[_Slot] = field(default_factory=list)


class CgroupBackend(Backend):
    name = "cgroup"

    def __init__(self, parent: str | None = None) -> None:
        self.tag = uuid.uuid4().hex[:10]
        self.h = fs.detect(self.tag, parent)
        self._envs: dict[str, _Env] = {}
        self._made_bases = False
        # a manager never closed still leaves no cgroup behind when the interpreter exits
        self._workdirs: set[str] = set()
        self._finalizer = weakref.finalize(self, _remove_bases, self.h.distinct(),
                                           self._workdirs)

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
        return f"cgroup (v{self.h.version}, under {self.h.base('cpu').parent})"

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
                f"enabled in its cgroup.subtree_control, {fs.FIX}") from exc
        self._made_bases = True

    @staticmethod
    def _enable_v2(folder: Path) -> None:
        have = set(fs.read(folder / "cgroup.subtree_control").split())
        need = [c for c in fs.V2_CONTROLLERS if c not in have]
        if need:
            fs.write(folder / "cgroup.subtree_control", " ".join(f"+{c}" for c in need))

    def _env_folders(self, env_id: str) -> dict[str, Path]:
        return {c: self.h.base(c) / env_id for c in fs.CONTROLLERS}

    async def open(self, env: Environment, cores: tuple[int, ...]) -> None:
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
                self._enable_v2(f)
        except OSError as exc:
            self._remove(folders)
            raise BackendUnavailable(f"cannot create the cgroup of environment {env.id} "
                                     f"({exc}); is the cgroup filesystem writable?") from exc
        self._envs[env.id] = _Env(folders)
        Path(env.workdir).mkdir(parents=True, exist_ok=True)
        self._workdirs.add(env.workdir)

    def _slot(self, env: Environment, e: _Env) -> _Slot:
        if e.free:
            return e.free.pop()
        name = f"x{len(e.slots)}"
        if self.h.version == 1:
            folders = {c: e.folders[c] / name for c in SLOT_CONTROLLERS}
            for f in dict.fromkeys(folders.values()):
                f.mkdir()
            mems = fs.read(e.folders["cpuset"] / "cpuset.mems")
            fs.write(folders["cpuset"] / "cpuset.mems", mems)
            joins = [*dict.fromkeys(folders.values()), e.folders["memory"]]
        else:
            f = e.folders["cpu"] / name
            f.mkdir()
            folders = {c: f for c in SLOT_CONTROLLERS}
            joins = [f]
        writes = " && ".join(f"echo 0 >{shlex.quote(str(j / 'cgroup.procs'))}" for j in joins)
        slot = _Slot(folders, f"{{ {writes}; }} 2>/dev/null || {{ echo '{JOIN_FAILED}' >&2; "
                              f"exit 125; }}")
        e.slots.append(slot)
        return slot

    def _confine(self, slot: _Slot, cores: tuple[int, ...]) -> None:
        cpus = fs.cpulist(cores)
        if self.h.version == 1:
            quota = str(len(cores) * fs.PERIOD_US)
            if cpus != slot.cpus:
                fs.write(slot.folders["cpuset"] / "cpuset.cpus", cpus)
            if quota != slot.quota:
                fs.write(slot.folders["cpu"] / "cpu.cfs_quota_us", quota)
        else:
            quota = f"{len(cores) * fs.PERIOD_US} {fs.PERIOD_US}"
            if cpus != slot.cpus:
                fs.write(slot.folders["cpuset"] / "cpuset.cpus", cpus)
            if quota != slot.quota:
                fs.write(slot.folders["cpu"] / "cpu.max", quota)
        slot.cpus, slot.quota = cpus, quota

    # -- exec ----------------------------------------------------------------------------------

    async def exec(self, env: Environment, cores: tuple[int, ...], command: Command,
                   timeout: float, output_cap: int) -> Outcome:
        e = self._envs.get(env.id)
        if e is None or not e.folders["cpu"].is_dir():
            raise EnvironmentBroken(f"environment {env.id} is broken: its cgroup "
                                    f"{self._env_folders(env.id)['cpu']} is gone")
        try:
            slot = self._slot(env, e)
            self._confine(slot, cores)
        except OSError as exc:
            raise EnvironmentBroken(f"environment {env.id} is broken: cannot set its cgroup "
                                    f"to cores {fs.cpulist(cores)} ({exc})") from exc
        leaf = slot.folders["cpu"]
        try:
            outcome = await run_local(_joined(slot.join, command), cwd=env.workdir,
                                      env={**os.environ, "TANGRAM_ENV": env.id},
                                      timeout=timeout, output_cap=output_cap,
                                      kill_rest=lambda: fs.kill_all(leaf))
        finally:
            e.free.append(slot)
        if outcome.exit_code == 125 and JOIN_FAILED in outcome.stderr:
            raise EnvironmentBroken(f"environment {env.id} is broken: the command could not "
                                    f"join its cgroup {leaf}")
        return outcome

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

    # -- teardown ------------------------------------------------------------------------------

    async def close(self, env: Environment) -> None:
        self._envs.pop(env.id, None)
        await asyncio.to_thread(self._remove, self._env_folders(env.id))
        shutil.rmtree(env.workdir, ignore_errors=True)
        self._workdirs.discard(env.workdir)

    def _remove(self, folders: dict[str, Path]) -> None:
        for top in dict.fromkeys(folders.values()):
            if not top.is_dir():
                continue
            subs = [p for p in top.iterdir() if p.is_dir()]
            for f in [*subs, top]:
                _rmdir_killing(f)

    async def shutdown(self) -> None:
        self._envs.clear()
        await asyncio.to_thread(self._finalizer)
        self._made_bases = False


def _remove_bases(bases: list[Path], workdirs: set[str]) -> None:
    """Kill what is left under Tangram's folders and remove them, deepest first; remove the
    environments' working directories."""
    for base in bases:
        if not base.is_dir():
            continue
        for env in [p for p in base.iterdir() if p.is_dir()]:
            for f in [*[p for p in env.iterdir() if p.is_dir()], env]:
                _rmdir_killing(f)
        _rmdir_killing(base)
    for w in workdirs:
        shutil.rmtree(w, ignore_errors=True)


def _joined(join: str, command: Command) -> list[str]:
    """The shell joins the slot first, so the command and all its descendants start confined
    (a shell string runs in that same shell; an argv is exec'd by it)."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", f"{join}\n{command}"]
    return ["/bin/sh", "-c", f'{join}\nexec "$@"', "sh", *command]


def _rmdir_killing(folder: Path) -> None:
    """Kill what is left in a cgroup folder and remove it (waiting for the dying to leave)."""
    import time

    for attempt in range(200):
        fs.kill_all(folder)
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY while killed processes are still exiting
            time.sleep(0.005 * min(attempt + 1, 10))
    log.warning("could not remove cgroup %s: processes remain", folder)


register("cgroup", CgroupBackend)
