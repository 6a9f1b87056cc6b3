"""Where an unprivileged server finds its cgroups (`cgroup.fs.delegation`): v1 per controller,
the parent it was given, else its own cgroup, else the folder `.ci/rootless.sh` delegates; v2 its
own cgroup or the parent. A controller with no writable place is named in the refusal with every
place tried. (Folders that do not exist stand for folders that cannot be written: the check runs
as root in CI, where every existing folder is writable.)"""

from __future__ import annotations

from pathlib import Path

from managers.cpu.backends.cgroup import fs


def _v1(tmp_path: Path) -> dict[str, Path]:
    mounts = {}
    for c in (*fs.CONTROLLERS, fs.OPTIONAL):
        (tmp_path / c).mkdir()
        mounts[c] = tmp_path / c
    return mounts


def test_v1_takes_the_parent_then_its_own_cgroup_then_the_delegated_folder(tmp_path):
    v1 = _v1(tmp_path)
    (v1["cpu"] / "job" / "1").mkdir(parents=True)  # its own cgroup there
    (v1["cpuset"] / "given").mkdir()
    for c in ("cpuacct", "memory", "pids"):
        (v1[c] / fs.user_folder()).mkdir()
    own = {"cpu": "/job/1", "cpuset": "/", "cpuacct": "/", "memory": "/x"}  # (cpuset: own ok too)
    found, why = fs.delegation("given", v1, None, own)
    assert found is not None and found.version == 1, why
    assert found.bases["cpuset"] == v1["cpuset"] / "given"  # the parent, first
    assert found.bases["cpu"] == v1["cpu"] / "job" / "1"  # its own cgroup
    assert found.bases["memory"] == v1["memory"] / fs.user_folder()  # the delegated one
    assert found.bases["cpuacct"] == v1["cpuacct"]  # its own is the root here (writable)


def test_v1_names_each_controller_without_a_writable_place(tmp_path):
    v1 = _v1(tmp_path)
    own = {c: "/not/there" for c in v1}
    for c in ("cpu", "cpuacct", "cpuset"):
        (v1[c] / fs.user_folder()).mkdir()
    found, why = fs.delegation(None, v1, None, own)
    assert found is None
    assert "memory: none of" in why and str(v1["memory"] / "not/there") in why
    assert "cpu:" not in why.split("memory:")[0].replace("cgroup v1:", "")


def test_v2_uses_its_own_cgroup_or_the_parent(tmp_path):
    v2 = tmp_path / "unified"
    mine = v2 / "user.slice" / "job"
    mine.mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu cpuset memory pids\n")
    (mine / "cgroup.procs").write_text("")
    found, why = fs.delegation(None, {}, v2, {"unified": "/user.slice/job"})
    assert found is not None and found.version == 2 and found.bases["cpu"] == mine, why
    assert found.pids
    found, why = fs.delegation(str(v2 / "nowhere"), {}, v2, {"unified": "/user.slice/job"})
    assert found is None and "nowhere is writable" in why
    found, why = fs.delegation(None, {}, v2, {"unified": "/gone"})
    assert found is None and str(v2 / fs.user_folder()) in why  # the delegated folder, tried
