"""The CPU backends' shared rules (`managers.cpu.backends.base`), checked on the rule itself and
on every backend that can run here: constructing touches nothing, use before `start` fails
clearly, one OOM rule, cancelled on close."""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager, ExecRequest
from managers.cpu.backends import BACKENDS, PREFERENCE, NotStarted, create, started
from managers.cpu.backends.base import SIGKILLED, LimitCounts, name_limits
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.sim import SimCpuBackend
from managers.cpu.environments import Environment
from managers.cpu.leftovers import owned_name
from tangram.errors import BackendUnavailable, ValidationError
from tangram.results import Result, Status
from topology import CpuNode

OOM = "x=$(yes | head -c 300000000); echo ${#x}"  # a shell holding 300 MB: no python needed
CGROUP_GLOBS = (
    "/sys/fs/cgroup/*/tangram-*",
    "/sys/fs/cgroup/*/*/tangram-*",
    "/sys/fs/cgroup/tangram-*",
    "/sys/fs/cgroup/*/*/*/tangram-*",
)


def _children() -> set[int]:
    """PIDs whose parent is this process (a trial sandbox, a ping helper, ...)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        found.add(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _system() -> tuple[set[int], set[str], set[str], set[str]]:
    """What this process owns on the machine: children, cgroups and folders named for it
    (`leftovers.owned_name`), its uid-range claims (other helpers share /tmp)."""
    ours = owned_name("")
    cgroups = {p for g in CGROUP_GLOBS for p in glob.glob(g) if ours in p}
    temp = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(ours)}
    try:
        claims = {
            ln
            for ln in Path("/run/tangram/uid-ranges").read_text().splitlines()
            if ln.split()[-1:] == [str(os.getpid())]
        }
    except OSError:
        claims = set()
    return _children(), cgroups, temp, claims


@pytest.mark.parametrize("name", BACKENDS.builtin_names())
def test_constructing_a_backend_or_its_manager_touches_nothing(name, tmp_path):
    before = _system()
    backend = create(name)
    state = tmp_path / "state"
    manager = CpuManager(name, state_dir=str(state), workdir_root=str(tmp_path / "work"))
    after = _system()
    assert after == before, f"{name}: constructing changed the system"
    assert not state.exists() and not (tmp_path / "work").exists()
    assert not backend.started and manager.swept == []
    assert not backend.support.exists()


def test_the_auto_manager_chooses_nothing_before_start():
    before = _system()
    m = CpuManager("auto")
    assert _system() == before and m.backend_name == "auto"
    with pytest.raises(NotStarted, match="start"):
        m.backend  # noqa: B018 (the property raises)


@pytest.mark.parametrize("name", BACKENDS.builtin_names())
def test_a_backend_used_before_start_says_so(name, tmp_path):
    backend = create(name)
    env = Environment("env-x", "t", "local", 64, str(tmp_path / "w"))
    with pytest.raises(NotStarted, match=f"the {name} backend cannot open.*start"):
        asyncio.run(backend.open(env, (0,)))
    # (no sandbox exists before start, so no exec can run before it: a command runs through
    # the `Sandbox` that `open` returns)
    asyncio.run(backend.shutdown())  # nothing to release: no error


def test_a_manager_used_before_start_says_so():
    m = CpuManager(SimCpuBackend(), nodes={"n": CpuNode.flat("n", 2)}, memory_mb={"n": 64})
    with pytest.raises(NotStarted, match="start"):
        asyncio.run(m.open_env("t", 32))


def test_unknown_options_name_what_the_backend_takes():
    takes = r"cpu.options.*takes: favor_dynmods, parent, pids_max.*uid_base"
    with pytest.raises(ValidationError, match=takes):
        create("cgroup", uid_base=5000)


# -- the one OOM rule, on the rule itself --------------------------------------------------------
counts = st.builds(LimitCounts, st.integers(0, 3), st.integers(0, 3))
outcomes = st.builds(
    Result,
    st.sampled_from(list(Status)),
    st.one_of(st.none(), st.sampled_from([0, 1, 2, 125, 126, 127, *SIGKILLED, -15])),
    detail=st.sampled_from(["exit code 1", "killed at its 1 s timeout", "x"]),
)


@given(outcomes, counts, counts, st.integers(1, 4096), st.integers(1, 512))
def test_the_oom_rule(outcome, before, after, memory_mb, pids_max):
    named = name_limits(outcome, before, after, memory_mb, pids_max)
    assert named.status == outcome.status  # the rule names a limit, it never re-labels
    assert (named.stdout, named.stderr, named.exit_code) == (
        outcome.stdout,
        outcome.stderr,
        outcome.exit_code,
    )
    ran = outcome.status in (Status.OK, Status.ERROR, Status.TIMEOUT)
    if not ran:
        assert named == outcome
        return
    oom = after.ooms > before.ooms
    assert (f"memory (limit {memory_mb} MiB)" in named.detail) == oom
    assert (f"process limit ({pids_max} pids)" in named.detail) == (after.refused > before.refused)
    if oom and outcome.status is Status.ERROR and outcome.exit_code in SIGKILLED:
        assert named.detail.startswith(f"killed: out of memory (limit {memory_mb} MiB)")
    else:
        assert named.detail.startswith(outcome.detail)  # what happened first, the limit after


# -- the rules on every backend that runs here ------------------------------------------------
def _runnable() -> list[str]:
    found = []
    for name in PREFERENCE:
        try:
            asyncio.run(_probe(name))
        except Exception:
            continue
        found.append(name)
    return found


async def _probe(name: str) -> None:
    b = create(name)
    await b.start()
    await b.shutdown()


RUNNABLE = _runnable()
MEMORY = [n for n in RUNNABLE if n in ("bwrap", "cgroup", "docker", "sim")]


async def _manager(name: str, tmp_path: Path) -> CpuManager:
    if name == "sim":  # a command's memory modelled: the OOM program needs 300 MiB
        backend = SimCpuBackend(
            lambda c, k: 2.0 if "sleep" in str(c) else 0.0,
            time_scale=1.0,
            peak_mb=lambda c: 300 if "300000000" in str(c) else 0,
        )
        m = CpuManager(
            backend, nodes={"local": CpuNode.flat("local", 2)}, memory_mb={"local": 1024}
        )
    else:
        m = CpuManager(name, workdir_root=str(tmp_path))
    await m.start()
    return m


@pytest.mark.parametrize("name", MEMORY)
def test_every_backend_names_an_oom_kill_alike(name, tmp_path):
    async def go():
        m = await _manager(name, tmp_path)
        try:
            env = await m.open_env("t", 64)
            killed = await m.execute(ExecRequest(env, OOM, timeout=60))
            ok = await m.execute(ExecRequest(env, "true"))
            return killed, ok
        finally:
            await m.close()

    killed, ok = asyncio.run(go())
    assert killed.status == "error" and killed.detail == "killed: out of memory (limit 64 MiB)"
    assert ok.status == "ok"


@pytest.mark.parametrize("name", [n for n in MEMORY if n != "sim"])
def test_a_timeout_stays_a_timeout_and_says_a_process_was_killed_for_memory(name, tmp_path):
    async def go():
        m = await _manager(name, tmp_path)
        try:
            env = await m.open_env("t", 64)
            # a child holds the memory and is killed; the shell goes on to its deadline
            return await m.execute(ExecRequest(env, f"sh -c '{OOM}'; sleep 30", timeout=3))
        finally:
            await m.close()

    o = asyncio.run(go())
    assert o.status == "timeout", o
    assert "timeout" in o.detail and "killed a process of it for memory (limit 64 MiB)" in o.detail


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_backend_cancels_a_command_whose_environment_closes(name, tmp_path):
    async def go():
        m = await _manager(name, tmp_path)
        try:
            env = await m.open_env("t", 64)
            running = asyncio.ensure_future(m.execute(ExecRequest(env, "sleep 20", timeout=60)))
            await asyncio.sleep(0.5)
            await m.close_env(env)
            return await asyncio.wait_for(running, 30)
        finally:
            await m.close()

    o = asyncio.run(go())
    assert o.status == "cancelled" and o.detail.endswith("was closed while the command ran"), o


# -- one cgroup-version rule, one writer of cpuset and quota ------------------------------------
def test_one_cgroup_version_rule(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert fs._version({}, v2) == 2
    assert fs._version({"cpu": tmp_path, "memory": tmp_path}, v2) == 1  # hybrid: v1 holds them
    (v2 / "cgroup.controllers").write_text("")  # systemd's empty unified mount
    assert fs._version({"cpu": tmp_path}, v2) == 1
    assert fs._version({}, v2) is None and fs._version({}, None) is None
    here = fs.folders_of(os.getpid())
    assert here is None or here[0] == fs.version()  # the docker backend's view: the same rule


@settings(deadline=None)  # files on a loaded machine: no per-example time limit
@given(st.sampled_from([1, 2]), st.lists(st.integers(0, 63), min_size=1, max_size=8, unique=True))
def test_set_cores_writes_exactly_the_grant_and_skips_what_it_holds(version, cores):
    with tempfile.TemporaryDirectory() as d:
        cpuset, cpu = Path(d) / "cpuset", Path(d) / "cpu"
        quota_file = cpu / ("cpu.cfs_quota_us" if version == 1 else "cpu.max")
        for f in (cpuset / "cpuset.cpus", quota_file):
            f.parent.mkdir(exist_ok=True)
            f.write_text("")
        folders = {"cpuset": cpuset, "cpu": cpu}
        now = fs.set_cores(version, folders, tuple(cores))
        assert (cpuset / "cpuset.cpus").read_text() == ",".join(map(str, cores)) == now[0]
        quota = len(cores) * fs.PERIOD_US
        assert (
            quota_file.read_text()
            == now[1]
            == (str(quota) if version == 1 else f"{quota} {fs.PERIOD_US}")
        )
        (cpuset / "cpuset.cpus").unlink()  # a write now would fail: nothing may be written
        quota_file.unlink()
        assert fs.set_cores(version, folders, tuple(cores), now) == now


@pytest.mark.parametrize("name", BACKENDS.builtin_names())
def test_a_backend_that_does_not_isolate_says_so_at_warning(name, caplog):
    """Commands that will run on the host as the server's user are said at WARNING when the
    backend starts (requested or chosen), never only at INFO; an isolating one says nothing."""
    backend = create(name)
    if backend.probe() is not None:
        pytest.skip(f"{name}: {backend.probe()}")
    caplog.set_level(logging.WARNING, logger="managers.cpu")
    try:
        started_one = asyncio.run(started(name))
    except BackendUnavailable as exc:
        pytest.skip(f"{name}: {exc}")
    asyncio.run(started_one.shutdown())
    said = [r for r in caplog.records if "does not isolate" in r.getMessage()]
    assert bool(said) == (not started_one.isolates and name != "sim"), (name, said)
    assert {"bwrap", "docker"} >= {n for n in [name] if create(n).isolates}
