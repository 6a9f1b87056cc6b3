"""Images, copy-on-write layers, the disk bound, fork and snapshot, files in and out: real
overlayfs and loop-mounted ext4 under a real bwrap sandbox (root)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.build import build
from managers.cpu.images import ImageStore
from managers.cpu.layers import LayerStore, mounts_below, unmount_below
from managers.cpu.leftovers import owned_name
from managers.cpu.request import ExecRequest
from tangram.errors import NotFound, ValidationError

TOOLS = ("sh", "cat", "ls", "dd", "ln", "mkdir", "rm", "sleep", "touch", "sync")
SECRET = "host-only-secret-d41d8cd9"


def _reason() -> str | None:
    why = BwrapBackend.probe()
    if why is not None:
        return why
    with tempfile.TemporaryDirectory() as d:
        return LayerStore(d).why_not


REASON = _reason()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"needs root, bwrap, overlayfs and loop devices: {REASON}"
)


@pytest.fixture(scope="module")
def state() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tangram-images-test."))
    os.chmod(d, 0o755)
    store = ImageStore(d / "images")
    build(
        store,
        "tools",
        [
            {"host": {"programs": list(TOOLS)}},
            {"file": {"path": "/etc/marker", "content": "from-the-image\n"}},
        ],
    )
    (d / "secret").write_text(SECRET)  # a host file beside the store: never readable inside
    yield d
    unmount_below(d)  # what a failed test left: everything under it is this module's
    shutil.rmtree(d, ignore_errors=True)


def run(coro):
    return asyncio.run(coro)


async def _manager(state: Path, **kw) -> CpuManager:
    m = CpuManager("bwrap", state_dir=str(state), **kw)
    await m.start()
    return m


def sh(m: CpuManager, env: str, command: str, timeout: float = 60.0):
    return m.execute(ExecRequest(env, command, timeout=timeout))


def leftovers(state: Path) -> list[str]:
    return mounts_below(state)


# -- the store -----------------------------------------------------------------------------------
def _tree(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "marker").write_text("m\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    os.chmod(root / "bin" / "tool", 0o755)
    (root / "lib").symlink_to("bin")


def _layer(members: dict[str, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _oci(folder: Path, layers: list[bytes]) -> None:
    import hashlib

    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return f"sha256:{h}"

    manifest = {
        "schemaVersion": 2,
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": put(la),
                "size": len(la),
            }
            for la in layers
        ],
    }
    digest = put(json.dumps(manifest).encode())
    (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (folder / "index.json").write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest}
                ],
            }
        )
    )


def test_import_folder_tarball_oci_content_addressed(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    src = tmp_path / "rootfs"
    _tree(src)
    a = store.import_("a", src)
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-cf", str(tarball), "-C", str(src), "."], check=True)
    b = store.import_("b:v1", tarball)
    assert a.digest == b.digest  # the same tree, whatever the source
    assert sorted(n for i in store.ls() for n in i.names) == ["a", "b:v1"]
    assert len(store.ls()) == 1
    oci = tmp_path / "oci"
    _oci(
        oci,
        [
            _layer(
                {"etc/": None, "etc/gone": b"x", "etc/kept": b"k", "opt/": None, "opt/old": b"o"}
            ),
            _layer({"etc/.wh.gone": b"", "opt/.wh..wh..opq": b"", "opt/new": b"n"}),
        ],
    )
    c = store.import_("c", oci)
    root = Path(c.rootfs)
    assert (root / "etc" / "kept").read_text() == "k"
    assert not (root / "etc" / "gone").exists()  # whiteout
    assert sorted(os.listdir(root / "opt")) == ["new"]  # opaque folder
    assert not list(root.rglob(".wh.*"))
    assert store.rm("a") == ["a"]
    assert Path(b.rootfs).is_dir()  # still named b:v1
    store.rm("b:v1")
    assert not Path(b.rootfs).exists()
    with pytest.raises(NotFound):
        store.resolve("a")
    with pytest.raises(ValidationError):
        store.import_("Bad Name", src)


# -- an environment from an image ---------------------------------------------------------------
def test_image_root_marker_visible_host_etc_not(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("img-1", 256, image="tools", disk_mb=32)
            r = await sh(
                m, env, f"cat /etc/marker; ls /etc; ls /; cat /etc/hostname; cat {state}/secret"
            )
            assert "from-the-image" in r.stdout
            assert r.stdout.split("\n")[1:4] == ["group", "marker", "passwd"]  # /etc: the image's
            assert SECRET not in r.stdout
            assert "hostname" not in r.stdout  # the host's /etc/hostname is not there
            assert "usr" in r.stdout  # the image's /usr (its copied tools)
            r = await sh(m, env, "echo $HOME; touch /tmp/t /sandbox/s && echo wrote")
            assert r.stdout.split() == ["/sandbox", "wrote"]
            r = await sh(m, env, "touch /etc/x")  # the image is not the user's to change
            assert r.exit_code != 0
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


def test_files_api_absolute_paths_stay_inside(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("files-1", 256, image="tools", disk_mb=32)
            await m.write_files(
                env, {"/etc/added": b"abs", "rel/dir/x": b"rel", "/sandbox/y": b"y"}
            )
            r = await sh(
                m,
                env,
                "cat /etc/added /sandbox/rel/dir/x /sandbox/y; "
                "echo more >> /sandbox/rel/dir/x && cat rel/dir/x",
            )
            assert r.stdout == "absrely" + "rel" + "more\n", r
            got = await m.read_files(
                env, ["/etc/marker", "rel/dir/x", "/nope", "../../../../etc/hostname", "/sandbox"]
            )
            assert got == {
                "/etc/marker": b"from-the-image\n",
                "rel/dir/x": b"relmore\n",
                "/nope": None,
                "../../../../etc/hostname": None,
                "/sandbox": None,
            }
            # links a command plants resolve inside the root, never on the host
            await sh(
                m,
                env,
                f"ln -s {state}/secret /sandbox/abs; ln -s ../../../../../.. "
                f"/sandbox/up; ln -s /etc/marker /sandbox/to-marker",
            )
            got = await m.read_files(
                env, ["/sandbox/abs", f"/sandbox/up{state}/secret", "/sandbox/to-marker"]
            )
            assert got == {
                "/sandbox/abs": None,
                f"/sandbox/up{state}/secret": None,
                "/sandbox/to-marker": b"from-the-image\n",
            }
            await m.write_files(env, {"/sandbox/up/tmp/escaped": b"e"})
            assert not Path("/tmp/escaped").exists()
            assert (await m.read_files(env, ["/tmp/escaped"]))["/tmp/escaped"] == b"e"
            with pytest.raises(ValidationError):
                await m.write_files(env, {"/": b"x"})
        finally:
            await m.close()

    run(go())


PART = st.sampled_from(["..", ".", "etc", "sandbox", "abs", "up", "loop", "secret", "x"])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(parts=st.lists(PART, min_size=1, max_size=8), absolute=st.booleans())
def test_property_no_path_reads_or_writes_the_host(
    state: Path, parts: list[str], absolute: bool
) -> None:
    """Whatever the path (`..`, links to host paths, to `..`, a loop), a read never returns a
    host file and a write never lands outside the environment's tree."""
    path = ("/" if absolute else "") + "/".join(parts)

    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("prop", 64, image="tools", disk_mb=16)
            await sh(
                m,
                env,
                f"ln -s {state} /sandbox/abs; ln -s ../../../../.. /sandbox/up; "
                f"ln -s loop /sandbox/loop; ln -s {state}/secret /sandbox/secret",
            )
            got = (await m.read_files(env, [path]))[path]
            assert got is None or SECRET.encode() not in got
            before = sorted(os.listdir(state))
            try:
                await m.write_files(env, {path + "/w": b"w"})
            except ValidationError:
                pass
            assert sorted(os.listdir(state)) == before
            assert not Path("/w").exists() and not Path("/etc/w").exists()
        finally:
            await m.close()

    run(go())


# -- the disk bound ------------------------------------------------------------------------------
def test_write_past_disk_mb_fails_inside_and_host_grows_at_most_the_bound(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("disk-1", 256, image="tools", disk_mb=32)
            r = await sh(m, env, "dd if=/dev/zero of=/sandbox/fill bs=1M count=100")
            assert r.status == "error"
            assert "No space left on device" in r.stderr
            assert "disk limit 32 MiB reached" in r.detail
            upper = m.envs.record(env).rooted.upper
            assert LayerStore.allocated_mb(upper) <= 32
            r = await sh(m, env, "rm /sandbox/fill && dd if=/dev/zero of=/tmp/f bs=1M count=8")
            assert r.ok, r  # room again once the file is gone
            # no image: the work folder is the bounded layer
            plain = await m.open_env("disk-2", 256, disk_mb=16)
            r = await sh(m, plain, "dd if=/dev/zero of=fill bs=1M count=64; ls /usr >/dev/null")
            assert "disk limit 16 MiB reached" in r.detail
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


# -- fork and snapshot ---------------------------------------------------------------------------
def test_fork_children_start_from_parent_and_are_isolated(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            parent = await m.open_env("fork-p", 128, image="tools", disk_mb=300)
            await m.write_files(parent, {"/sandbox/a": b"parent"})
            r = await sh(m, parent, "dd if=/dev/zero of=/sandbox/big bs=1M count=200 && sync")
            assert r.ok, r
            empty = await m.open_env("fork-e", 128, image="tools", disk_mb=300)
            timings = {}
            for name, env in (("200 MB", parent), ("empty", empty)):
                t = time.perf_counter()
                kids = await m.fork_env(env, [f"{name}-k{i}" for i in range(2)])
                timings[name] = time.perf_counter() - t
                if env == parent:
                    children = kids
            print(
                f"fork of 2: parent with 200 MB {timings['200 MB'] * 1e3:.0f} ms, empty "
                f"parent {timings['empty'] * 1e3:.0f} ms (loaded machine)"
            )
            k1, k2 = children
            for k in children:
                got = await m.read_files(k, ["/sandbox/a"])
                assert got["/sandbox/a"] == b"parent"
            r = await sh(m, k1, "echo k1 > /sandbox/a; echo mine > /sandbox/k1; ls -l /sandbox/big")
            assert r.ok and r.stdout.split()[4] == str(200 << 20), r  # the parent's, shared
            assert (await m.read_files(k2, ["/sandbox/a", "/sandbox/k1"])) == {
                "/sandbox/a": b"parent",
                "/sandbox/k1": None,
            }
            assert (await m.read_files(parent, ["/sandbox/a", "/sandbox/k1"])) == {
                "/sandbox/a": b"parent",
                "/sandbox/k1": None,
            }
            await m.write_files(parent, {"/sandbox/later": b"p"})
            assert (await m.read_files(k1, ["/sandbox/later"]))["/sandbox/later"] is None
            r = await sh(m, parent, "cat /sandbox/a /sandbox/later")
            assert r.stdout == "parentp", r  # the parent goes on, its own writable again
            await m.close_env(parent)  # children keep the frozen layer
            assert (await m.read_files(k1, ["/sandbox/a"]))["/sandbox/a"] == b"k1\n"
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


def test_snapshot_outlives_its_env_and_opens(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("snap-1", 128, image="tools", disk_mb=32)
            await m.write_files(env, {"/sandbox/s": b"one"})
            sid = await m.snapshot(env)
            await m.write_files(env, {"/sandbox/s": b"two"})
            await m.close_env(env)
            assert [s["snapshot_id"] for s in m.snapshots()] == [sid]
            again = await m.open_env("snap-2", 128, snapshot=sid)
            r = await sh(m, again, "cat /sandbox/s /etc/marker; echo x > /sandbox/s")
            assert r.ok and r.stdout == "onefrom-the-image\n", r  # its uid owns the files
            with pytest.raises(ValidationError):
                await m.open_env("snap-3", 128, image="tools", snapshot=sid)
            await m.delete_snapshot(sid)
            assert m.snapshots() == []
            with pytest.raises(NotFound):
                await m.open_env("snap-4", 128, snapshot=sid)
            digest = m.roots.images.resolve("tools").digest
            with pytest.raises(ValidationError):  # the image is held while something uses it
                m.roots.images.rm(digest)
            assert m.roots.images.resolve("tools").digest == digest  # and keeps its name
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


def test_fork_refuses_plain_envs_and_bad_input(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            plain = await m.open_env("plain", 64)
            with pytest.raises(ValidationError, match="no layer to fork"):
                await m.fork_env(plain, ["x"])
            with pytest.raises(ValidationError, match="no root of its own"):
                await m.write_files(plain, {"/etc/x": b"x"})
            await m.write_files(plain, {"/sandbox/ok": b"ok", "rel": b"r"})
            assert await m.read_files(plain, ["ok", "/sandbox/rel"]) == {
                "ok": b"ok",
                "/sandbox/rel": b"r",
            }
            env = await m.open_env("layered", 64, image="tools", disk_mb=16)
            for bad in ([], "abc", ["plain"], ["a", "a"], [""]):
                with pytest.raises(ValidationError):
                    await m.fork_env(env, bad)
            with pytest.raises(NotFound):
                await m.open_env("n", 64, image="no-such-image")
            with pytest.raises(ValidationError):
                await m.open_env("n", 64, image="tools", disk_mb=0)
            assert len(m.envs.all()) == 2  # nothing half-opened
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


# -- over HTTP -----------------------------------------------------------------------------------
def test_http_and_client_images_fork_snapshot_files(state: Path) -> None:
    import httpx

    from tangram.runtime.client import TangramClient
    from tangram.runtime.facade import Tangram
    from tangram.runtime.server import create_app, serve_in_thread

    tg = Tangram(cpu=CpuManager("bwrap", state_dir=str(state)))
    with serve_in_thread(create_app(tg)) as url:

        async def go():
            async with TangramClient(url) as c:
                env = await c.open_env("http-1", memory_mb=128, image="tools", disk_mb=32)
                await c.write_files(env, {"/etc/h": b"\x00\xffbin", "w.txt": b"w"})
                assert await c.read_files(env, ["/etc/h", "/sandbox/w.txt", "/none"]) == {
                    "/etc/h": b"\x00\xffbin",
                    "/sandbox/w.txt": b"w",
                    "/none": None,
                }
                kids = await c.fork_env(env, ["http-k1", "http-k2"])
                assert len(kids) == 2
                r = await c.exec(kids[0], "cat /etc/h /sandbox/w.txt")
                assert r.ok and r.stdout.endswith("binw"), r
                sid = await c.snapshot(kids[1])
                assert [s["snapshot_id"] for s in await c.snapshots()] == [sid]
                from_snap = await c.open_env("http-s", memory_mb=64, snapshot=sid)
                assert (await c.read_files(from_snap, ["w.txt"]))["w.txt"] == b"w"
                tar = await c.tar_files(from_snap, "/sandbox")
                with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                    assert "./w.txt" in t.getnames()
                await c.delete_snapshot(sid)
                with pytest.raises(ValidationError) as e:
                    await c.delete_snapshot(sid)
                assert e.value.field == "snapshot"
                with pytest.raises(ValidationError) as e:
                    await c.open_env("http-x", image="nope")
                assert e.value.field == "env.image"
            async with httpx.AsyncClient(base_url=url) as h:
                bad = await h.put(f"/v1/envs/{env}/files", json={"files": {"a": "!!"}})
                assert bad.status_code == 422 and bad.json()["field"] == "files.a"
                bad = await h.post(f"/v1/envs/{env}/fork", json={"trajectories": []})
                assert bad.status_code == 422 and bad.json()["field"] == "trajectories"
                bad = await h.post("/v1/envs/env-nope/files/read", json={"paths": ["a"]})
                assert bad.status_code in (404, 422), bad.text
                bad = await h.get(f"/v1/envs/{env}/files/tar", params={"path": "/nope"})
                assert bad.status_code == 422 and bad.json()["field"] == "files", bad.text

        asyncio.run(go())
    assert leftovers(state) == []  # shutdown closed every environment and snapshot


# -- crash safety ----------------------------------------------------------------------------------
CRASHING = """
import asyncio, sys
from managers.cpu import CpuManager
async def main():
    m = CpuManager("bwrap", state_dir=sys.argv[1])
    await m.start()
    env = await m.open_env("crash", 64, image="tools", disk_mb=16)
    await m.fork_env(env, ["crash-k"])
    await m.snapshot(env)
    print("ready", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_sigkill_then_restart_sweeps_mounts_layers_snapshots(state: Path) -> None:
    import signal

    proc = subprocess.Popen(
        [os.sys.executable, "-c", CRASHING, str(state)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert leftovers(state)  # its roots and layers are mounted
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    owned = [
        p
        for d in ("roots", "layers")
        for p in (state / d).iterdir()
        if p.name.startswith(owned_name("", proc.pid))
    ]
    assert owned
    m = CpuManager("bwrap", state_dir=str(state))  # the next server sweeps before serving
    asyncio.run(m.start())
    try:
        assert any(f"server pid {proc.pid}" in line for line in m.swept)
        assert leftovers(state) == []
        assert not any(p.exists() for p in owned)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # loop devices go once their last user has died
            loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
            if str(state) not in loops:
                break
            time.sleep(0.1)
        assert str(state) not in loops
    finally:
        asyncio.run(m.close())


def test_disk_counts_in_the_node_choice(state: Path) -> None:
    from tangram.errors import Infeasible

    async def go():
        m = await _manager(state, disk_capacity_mb=100)
        try:
            env = await m.open_env("room-1", 64, image="tools", disk_mb=40)
            with pytest.raises(Infeasible, match="disk"):
                await m.open_env("room-2", 64, image="tools", disk_mb=80)
            with pytest.raises(Infeasible, match="disk"):
                await m.fork_env(env, ["room-k1", "room-k2"])  # 40 + 2 x 40 > 100
            kid = (await m.fork_env(env, ["room-k1"]))[0]
            assert m.envs.disk_reserved["local"] >= 80
            await m.close_env(kid)
            await m.close_env(env)
            assert m.envs.disk_reserved["local"] == 0  # the frozen layer went with them
        finally:
            await m.close()

    run(go())


def test_ray_fork_stays_on_its_parents_node(state: Path) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed")
    del ray
    from tangram.runtime.facade import Tangram
    from tangram.runtime.ray import local_cluster

    async def go(address: str) -> None:
        async with Tangram.ray(address, cpu_backend="bwrap", poll_s=0.2) as tg:
            env = await tg.open_env("ray-1", 64, image="tools", disk_mb=16)
            await tg.write_files(env, {"/sandbox/f": b"ray"})
            kids = await tg.fork_env(env, ["ray-k1", "ray-k2"])
            node = tg.cpu.binding("ray-1")
            assert [tg.cpu.binding(t) for t in ("ray-k1", "ray-k2")] == [node, node]
            r = await tg.exec(kids[1], "cat /sandbox/f /etc/marker")
            assert r.ok and r.stdout == "rayfrom-the-image\n", r
            sid = await tg.snapshot(kids[0])
            again = await tg.open_env("ray-s", 64, snapshot=sid)
            assert tg.cpu.binding("ray-s") == node
            assert (await tg.read_files(again, ["f"]))["f"] == b"ray"
            await tg.delete_snapshot(sid)
            assert tg.snapshots() == []

    old = os.environ.get("TANGRAM_STATE_DIR")
    os.environ["TANGRAM_STATE_DIR"] = str(state)  # the agents' image store: this test's
    try:
        with local_cluster(nodes=2, cpus_per_node=1) as cluster:
            asyncio.run(go(cluster.address))
    finally:
        if old is None:
            os.environ.pop("TANGRAM_STATE_DIR")
        else:
            os.environ["TANGRAM_STATE_DIR"] = old


def test_verl_tool_opens_its_sample_from_an_image(state: Path) -> None:
    from tangram.adapters import verl as adapter
    from tangram.runtime.facade import Tangram

    schema = {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
    if adapter.HAVE_VERL:
        from verl.tools.schemas import OpenAIFunctionToolSchema

        schema = OpenAIFunctionToolSchema.model_validate(schema)
    runner = adapter.TangramRunner(lambda: Tangram(cpu=CpuManager("bwrap", state_dir=str(state))))
    try:
        tool = adapter.TangramTool(
            {"image": "tools", "disk_mb": 16, "memory_mb": 64}, schema, runner=runner
        )

        async def main():
            created = await tool.create("verl-img")  # the tool's image
            iid = created if isinstance(created, str) else created[0]
            resp, _, _ = await tool.execute(iid, {"command": "cat /etc/marker"})
            text = resp if isinstance(resp, str) else resp.text
            assert "from-the-image" in text
            sid = await runner.call(runner.tangram.snapshot(tool.envs[iid]))
            created = await tool.create("verl-snap", snapshot=sid)  # a sample's create_kwargs
            other = created if isinstance(created, str) else created[0]
            resp, _, _ = await tool.execute(other, {"command": "ls /etc"})
            text = resp if isinstance(resp, str) else resp.text
            assert "marker" in text
            await tool.release(iid)
            await tool.release(other)

        asyncio.run(main())
    finally:
        runner.close()
    assert leftovers(state) == []


def test_tar_stream_of_a_folder_keeps_links_and_stays_inside(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("tar-1", 64, image="tools", disk_mb=16)
            await m.write_files(env, {"repo/a.py": b"print(1)\n", "repo/sub/b.txt": b"b"})
            await sh(m, env, f"ln -s {state} /sandbox/repo/host; ln -s ../../../.. /sandbox/up")
            data = b"".join([c async for c in m.tar_files(env, "repo")])
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                members = {t.name: t for t in tar.getmembers()}
                assert tar.extractfile("./a.py").read() == b"print(1)\n"
            assert members["./host"].issym() and members["./host"].linkname == str(state)
            assert set(members) == {".", "./a.py", "./sub", "./sub/b.txt", "./host"}
            # a path through a planted link resolves inside the environment's root
            up = b"".join([c async for c in m.tar_files(env, "/sandbox/up/etc")])
            with tarfile.open(fileobj=io.BytesIO(up)) as tar:
                assert "./marker" in tar.getnames()
            with pytest.raises(ValidationError):
                _ = [c async for c in m.tar_files(env, "/no/such/folder")]
        finally:
            await m.close()

    run(go())


def test_image_cli_import_ls_build_rm(tmp_path: Path, capsys) -> None:
    from tangram.runtime.image_cli import main as tangram  # `tangram image` (its entry point)

    src = tmp_path / "rootfs"
    _tree(src)
    state = ["--state-dir", str(tmp_path / "state")]
    assert tangram([*state, "import", "mine", str(src)]) == 0
    assert (
        tangram(
            [*state, "build", "tiny", "--host", "sh", "--copy", f"{src}/etc/marker:/etc/marker"]
        )
        == 0
    )
    assert (
        tangram(
            [*state, "build", "tiny", "--host", "sh", "--copy", f"{src}/etc/marker:/etc/marker"]
        )
        == 0
    )  # every step cached
    err = capsys.readouterr().err
    assert "step 1/2 host: cached" in err and "step 2/2 copy: cached" in err
    assert tangram([*state, "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    named = {n: i["digest"] for i in listed for n in i["names"]}
    assert set(named) == {"mine", "tiny"}
    tiny = Path(next(i["rootfs"] for i in listed if "tiny" in i["names"]))
    assert (tiny / "etc" / "marker").read_text() == "m\n" and (tiny / "usr" / "bin").is_dir()
    assert tangram([*state, "ls"]) == 0  # for a person: where the store is, a header, names
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith(f"images in {tmp_path / 'state'}/images")
    assert shown[1].split() == ["DIGEST", "SIZE", "NAMES"]
    assert any(line.endswith("mine") for line in shown) and "(a build step's cache" in "".join(
        shown
    )
    assert tangram([*state, "rm", "mine"]) == 0
    with pytest.raises(NotFound, match="no such image"):  # `tangram` prints it, exit 2
        tangram([*state, "rm", "mine"])


@pytest.mark.docker
def test_docker_backend_takes_the_image_per_environment(need_docker) -> None:
    from managers.cpu.backends.docker import DEFAULT_IMAGE, DockerBackend
    from managers.cpu.leftovers import owned_name

    async def go():
        backend = DockerBackend()
        m = CpuManager(backend)
        await m.start()
        backend.client.images.get(DEFAULT_IMAGE).tag("tangram-test-per-env", "v1")
        try:
            env = await m.open_env("docker-img", 64, image="tangram-test-per-env:v1")
            plain = await m.open_env("docker-plain", 64)
            tags = {
                e: backend.client.containers.get(owned_name(e)).attrs["Config"]["Image"]
                for e in (env, plain)
            }
            assert tags == {env: "tangram-test-per-env:v1", plain: DEFAULT_IMAGE}
            r = await m.execute(ExecRequest(env, "echo in-its-image"))
            assert r.ok and r.stdout == "in-its-image\n", r
        finally:
            await m.close()
            backend.client.images.remove("tangram-test-per-env:v1")

    run(go())


def test_a_command_granted_during_a_fork_waits_for_it(state: Path) -> None:
    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("race-1", 64, image="tools", disk_mb=16)
            await m.write_files(env, {"/sandbox/f": b"before"})
            fork = asyncio.ensure_future(m.fork_env(env, ["race-k"]))
            await asyncio.sleep(0)  # the fork has begun: the sandbox is being re-stacked
            r = await sh(m, env, "cat /sandbox/f && echo after > /sandbox/f")
            kid = (await fork)[0]
            assert r.ok and r.stdout == "before", r
            assert (await m.read_files(kid, ["/sandbox/f"]))["/sandbox/f"] == b"before"
            both = await asyncio.gather(m.snapshot(env), m.snapshot(env), return_exceptions=True)
            assert sum(isinstance(b, ValidationError) for b in both) == 1, both
            # closing while a snapshot is under way leaves nothing behind either
            asyncio.ensure_future(m.snapshot(env))
            await asyncio.sleep(0)
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


def test_after_a_fork_the_parent_owns_its_work_folder_as_before(state: Path) -> None:
    """A fork remounts the parent on a fresh writable layer, whose top folder is root's 0755:
    the parent's user must still own its work folder with its mode (a disk_mb environment
    without an image: its work folder is that top; an image's: its root), and write to it."""

    def owners(r) -> list[tuple[str, ...]]:  # `ls -ldn`: (mode, uid, gid) of each folder
        return [tuple(line.split()[i] for i in (0, 2, 3)) for line in r.stdout.splitlines()[:2]]

    async def go():
        m = await _manager(state)
        try:
            for label, kw in (
                ("disk", {"disk_mb": 64}),
                ("image", {"image": "tools", "disk_mb": 64}),
            ):
                parent = await m.open_env(f"own-{label}", 128, **kw)
                look = "ls -ldn /sandbox /"
                before = await sh(m, parent, f"{look} && echo a > /sandbox/a")
                assert before.ok and before.stdout.count("\n") == 2, before
                (kid,) = await m.fork_env(parent, [f"own-{label}-kid"])
                for env in (parent, kid):
                    after = await sh(m, env, f"{look} && echo b > /sandbox/b && cat /sandbox/a")
                    assert after.ok, (label, env, after)
                    assert after.stdout.splitlines()[-1] == "a"
                    # each as its own user (a child has a uid of its own, `test_fork_uids`)
                    mine, theirs = (str(m.sandbox(e).uid) for e in (env, parent))
                    same = [tuple(mine if x == theirs else x for x in o) for o in owners(before)]
                    assert owners(after) == same, (label, env)
                await m.close_env(kid)
                await m.close_env(parent)
        finally:
            await m.close()
        assert leftovers(state) == []

    run(go())


def test_a_full_disk_is_named_by_the_command_that_filled_it_not_by_later_ones(state: Path) -> None:
    """Issue 36: after the disk filled, every later result said "disk limit N MiB reached",
    whatever ended it (an out-of-memory kill read "ok ... disk limit 32 MiB reached"). Named
    now by the command that filled it, and by a later one only when that one failed."""

    async def go():
        m = await _manager(state)
        try:
            env = await m.open_env("full-disk", 128, disk_mb=32)
            fill = await sh(m, env, "dd if=/dev/zero of=/sandbox/f bs=1M count=64; sync")
            later = await sh(m, env, "echo fine")
            failing = await sh(m, env, "dd if=/dev/zero of=/sandbox/g bs=1M count=8")
            await m.close_env(env)
            return fill, later, failing
        finally:
            await m.close()

    fill, later, failing = run(go())
    assert "disk limit 32 MiB reached" in fill.detail, fill
    assert later.ok and later.detail == "exit code 0", later
    assert not failing.ok and "disk limit 32 MiB reached" in failing.detail, failing
