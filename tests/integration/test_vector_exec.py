"""Vector execs (issue 35, item 2): `tg.exec(env, cmd, cpu=..., gpus=k)` is one action over the
CPU pool and a GPU chunk, run by the CPU manager with the chunk's devices; the GPU manager
evicts what is resident on the chunk first and restores nothing onto it while the command runs.

Real components: the runtime's facade and scheduler, the CPU manager on its `sim` backend (and
on `bwrap`, as root, with fake device nodes), the GPU manager on its `sim` backend, the HTTP
server on loopback and its client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from managers.cpu import CpuManager, seccomp
from managers.cpu.actions import exec_action
from managers.cpu.backends.affinity import AffinityBackend
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.sim import SimCpuBackend
from managers.cpu.build import build
from managers.cpu.images import ImageStore
from managers.cpu.layers import LayerStore, unmount_below
from managers.gpu import GB, GpuManager, Residency, Service, ServiceRegistry
from managers.gpu.sim import SimGpuBackend
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import InvariantError, ValidationError
from tangram.pools import ChunkPool, Placement
from tangram.profiles import DurationProfiles
from tangram.results import Status
from tangram.runtime.client import TangramClient
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app, serve_in_thread
from topology import ChunkTree, CpuNode

SERVICE = Service.uniform("judge", 30 * GB, (1, 2), restore_s=0.01, infer_s=0.01)


class Gate:
    """The sim CPU backend's `sleep`: a command runs until the test opens the gate; `seen`
    holds what `on_run` returned while it ran (no timing: the test decides when it ends)."""

    def __init__(self, on_run=lambda: None) -> None:
        self.on_run = on_run
        self.running = asyncio.Event()
        self.open = asyncio.Event()
        self.seen: list = []

    async def __call__(self, seconds: float) -> None:
        self.seen.append(self.on_run())
        self.running.set()
        await self.open.wait()


def gpu_manager(gpus: int = 2, nodes: tuple[str, ...] = ("gpu0",), backend=None) -> GpuManager:
    registry = ServiceRegistry({"judge": SERVICE})
    residency = Residency.uniform(dict.fromkeys(nodes, gpus), 80 * GB, registry)
    pool = ChunkPool("gpu", {n: ChunkTree(gpus, n) for n in nodes})
    return GpuManager(pool, residency, backend or SimGpuBackend(time_scale=0))


def sim_cpu(sleep=asyncio.sleep, nodes: tuple[str, ...] = ("local",)) -> CpuManager:
    backend = SimCpuBackend(duration=lambda command, cores: 1.0, time_scale=1.0, sleep=sleep)
    return CpuManager(
        backend,
        nodes={n: CpuNode(n, {0: (0, 1, 2, 3)}) for n in nodes},
        memory_mb=dict.fromkeys(nodes, 4096),
    )


def instant_cpu(nodes: tuple[str, ...] = ("local",)) -> CpuManager:
    return CpuManager(
        SimCpuBackend(),
        nodes={n: CpuNode(n, {0: (0, 1, 2, 3)}) for n in nodes},
        memory_mb=dict.fromkeys(nodes, 4096),
    )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def run_granted(tg: Tangram, env: str, command: str, chunk: tuple[int, int], timeout=30):
    """Hand the CPU manager an assignment of one core and GPUs `chunk` of gpu0 directly, past
    the scheduler (a remote node's assignment, or a grant the test chooses)."""
    k = chunk[1] - chunk[0]
    action = exec_action(
        "cpu", env, "t", command, 1, elastic=False, timeout=timeout, output_cap=None,
        kind=None, profiles=DurationProfiles(), now=0.0, gpus=k, gpu_resource="gpu",
        gpu_node="gpu0",
    )  # fmt: skip
    placement = {"cpu": Placement("local", cores=(0,)), "gpu": Placement("gpu0", chunk=chunk)}
    return await tg.cpu.run(Assignment(action, {"cpu": 1, "gpu": k}, placement))


# -- (a) one action over both pools -----------------------------------------------------------


def test_a_vector_exec_is_one_action_holding_cores_and_a_gpu():
    async def main():
        gate = Gate()
        async with Tangram(cpu=sim_cpu(gate), gpu=gpu_manager(2)) as tg:
            cpu, gpu = tg.cpu.resource, tg.gpu.resource
            env = await tg.open_env("t", memory_mb=64)
            task = asyncio.create_task(tg.exec(env, "nvidia-smi", cpu=2, gpus=1))
            await gate.running.wait()
            (running,) = tg.scheduler.running.values()  # one action, both pools
            st = tg.status()
            assert st.pools[gpu].free == 1 and st.pools[cpu].free == 2
            gate.open.set()
            r = await task
            assert r.ok, r.detail
            assert r.action_id == running.assignment.action.id
            assert r.units == {cpu: 2, gpu: 1}
            assert set(r.placement) == {cpu, gpu}
            chunk = r.placement[gpu].chunk
            assert chunk is not None and chunk[1] - chunk[0] == 1
            assert len(r.placement[cpu].cores) == 2
            # the sim backend records the grant: the chunk's GPU, for that command
            assert tg.cpu.backend.gpu_grants == [(env, (chunk[0],), "nvidia-smi")]
            st = tg.status()
            assert st.pools[gpu].free == 2 and st.pools[cpu].free == 4  # both came back

    run(main())


def test_the_chunk_comes_from_the_environments_machine():
    """Two machines whose pools are named alike (as on Ray): each environment's vector exec gets
    its GPU on its own machine, never the other's."""

    async def main():
        nodes = ("a", "b")
        async with Tangram(cpu=instant_cpu(nodes), gpu=gpu_manager(2, nodes)) as tg:
            envs = [await tg.open_env(f"t{i}", memory_mb=64) for i in range(2)]
            where = {tg.cpu.binding(f"t{i}") for i in range(2)}
            assert where == {"a", "b"}  # one environment on each machine
            for _ in range(2):
                results = await asyncio.gather(*(tg.exec(e, "x", cpu=1, gpus=1) for e in envs))
                for r in results:
                    assert r.ok, r.detail
                    assert r.placement["gpu"].node == r.placement["cpu"].node
            # the CPU manager itself refuses a chunk of another machine (a wrong assignment)
            node = tg.cpu.binding("t0")
            other = "b" if node == "a" else "a"
            action = exec_action(
                "cpu", envs[0], "t0", "x", 1, elastic=False, timeout=5, output_cap=None,
                kind=None, profiles=DurationProfiles(), now=0.0, gpus=1, gpu_resource="gpu",
                gpu_node=node,
            )  # fmt: skip
            placement = {"cpu": Placement(node, cores=(0,)), "gpu": Placement(other, chunk=(0, 1))}
            ran = len(tg.cpu.backend.execs)
            r = await tg.cpu.run(Assignment(action, {"cpu": 1, "gpu": 1}, placement))
            assert r.status is Status.FAILED and r.detail.startswith("gpus:") and node in r.detail
            assert len(tg.cpu.backend.execs) == ran  # nothing ran for it

    run(main())


def test_no_gpu_node_on_the_environments_machine_is_refused_naming_gpus():
    async def main():
        cpu = instant_cpu(("a", "b"))
        async with Tangram(cpu=cpu, gpu=gpu_manager(2, ("g0", "g1"))) as tg:
            env = await tg.open_env("t", memory_mb=64)
            with pytest.raises(ValidationError) as bad:
                await tg.exec(env, "x", gpus=1)
            assert bad.value.field == "gpus" and "has no GPUs" in bad.value.problem
            with pytest.raises(ValidationError) as bad:
                await tg.exec(env, "x", gpus=3)  # not one aligned chunk
            assert bad.value.field == "gpus"
            assert not tg.scheduler.queue and not tg.scheduler.running

    run(main())


class RefusingSim(SimCpuBackend):
    gpus_refused = "this test's backend gives a command no GPUs"


def test_a_backend_that_gives_no_gpus_refuses_at_submission_and_at_run():
    async def main():
        cpu = CpuManager(RefusingSim(), nodes={"local": CpuNode("local", {0: (0, 1)})})
        async with Tangram(cpu=cpu, gpu=gpu_manager(1)) as tg:
            env = await tg.open_env("t", memory_mb=64)
            with pytest.raises(ValidationError) as bad:
                await tg.exec(env, "x", gpus=1)
            assert bad.value.field == "gpus" and "no GPUs" in bad.value.problem
            # and the backend itself, should an assignment reach it (a remote node's)
            r = await run_granted(tg, env, "x", (0, 1), timeout=5)
            assert r.status is Status.FAILED and r.detail.startswith("gpus: this test's backend")

    run(main())


# -- (f) no GPU manager -------------------------------------------------------------------------


def test_without_a_gpu_manager_gpus_is_a_clear_error():
    async def main():
        async with Tangram(cpu=instant_cpu()) as tg:
            env = await tg.open_env("t", memory_mb=64)
            with pytest.raises(ValidationError) as bad:
                await tg.exec(env, "x", cpu=1, gpus=1)
            assert bad.value.field == "gpus" and "no GPU manager" in bad.value.problem
            assert (await tg.exec(env, "x", cpu=1)).ok  # without gpus nothing changes

    run(main())


def test_the_sharded_scheduler_refuses_gpus_naming_it():
    """Shards decide a node's cores apart from the pooled GPUs (docs/scale.md): a vector exec
    is refused at submission, naming `gpus`, and nothing is queued or held."""

    async def main():
        async with Tangram(cpu=instant_cpu(), gpu=gpu_manager(2), shards=1) as tg:
            env = await tg.open_env("t", memory_mb=64)
            with pytest.raises(ValidationError, match="sharded scheduler") as bad:
                await tg.exec(env, "x", cpu=1, gpus=1)
            assert bad.value.field == "gpus"
            assert not tg.scheduler.queued() and not tg.scheduler.running
            assert (await tg.exec(env, "x", cpu=1)).ok

    run(main())


# -- (c) evict-on-execution -------------------------------------------------------------------


def test_a_service_copy_on_the_granted_gpu_is_evicted_before_the_command_and_restored_after():
    async def main():
        sim = SimGpuBackend(time_scale=0)
        gpu = gpu_manager(1, backend=sim)
        gate = Gate(on_run=lambda: (list(sim.calls), gpu.residency.entries()))
        async with Tangram(cpu=sim_cpu(gate), gpu=gpu) as tg:
            first = await tg.invoke("judge", {"n": 1}, gpus=1)
            assert first.ok and first.detail == "restored"
            assert gpu.residency.is_resident("judge", "gpu0", (0, 1))
            env = await tg.open_env("t", memory_mb=64)
            task = asyncio.create_task(tg.exec(env, "python train.py", cpu=1, gpus=1))
            await gate.running.wait()
            calls, resident = gate.seen[0]  # as the command started
            assert calls[-1] == ("evict", "judge", "gpu0", (0, 1)) and resident == []
            # while the command holds the GPU, a call of the service waits: nothing is restored
            waiting = asyncio.create_task(tg.invoke("judge", {"n": 2}, gpus=1))
            await asyncio.sleep(0)
            assert tg.status().queue == 1 and sim.calls[-1][0] == "evict"
            gate.open.set()
            assert (await task).ok
            again = await waiting
            assert again.ok and again.detail == "restored" and again.restore_s > 0
            assert [c[0] for c in sim.calls] == ["restore", "invoke", "evict", "restore", "invoke"]

    run(main())


def test_a_command_prefers_a_gpu_nothing_is_resident_on():
    async def main():
        sim = SimGpuBackend(time_scale=0)
        async with Tangram(cpu=instant_cpu(), gpu=gpu_manager(2, backend=sim)) as tg:
            assert (await tg.invoke("judge", {}, gpus=1)).placement["gpu"].chunk == (0, 1)
            env = await tg.open_env("t", memory_mb=64)
            r = await tg.exec(env, "x", cpu=1, gpus=1)
            assert r.ok and r.placement["gpu"].chunk == (1, 2)
            assert "evict" not in [c[0] for c in sim.calls]  # the copy on GPU 0 stays

    run(main())


def test_a_held_gpu_takes_no_restore():
    registry = ServiceRegistry({"judge": SERVICE})
    res = Residency.uniform({"n": 2}, 80 * GB, registry)
    command = exec_action(
        "cpu", "e", "t", "x", 1, elastic=False, timeout=5, output_cap=None, kind=None,
        profiles=DurationProfiles(), now=0.0,
    )  # fmt: skip
    call = Action("g-1", {"gpu": 2}, service="judge", duration=1.0)
    assert res.begin(call, "n", (0, 2), 0.0).restored
    res.end(call, "n", (0, 2), 1.0)
    evicted = res.hold(command, "n", (1, 2), 2.0)
    assert [e.chunk for e in evicted] == [(0, 2)]  # the copy over both GPUs goes whole
    with pytest.raises(InvariantError, match="cannot also run"):
        res.begin(Action("g-2", {"gpu": 1}, service="judge", duration=1.0), "n", (1, 2), 3.0)
    res.end(command, "n", (1, 2), 4.0)
    assert res.begin(Action("g-3", {"gpu": 1}, service="judge", duration=1.0), "n", (1, 2), 5.0)


# -- (b) bwrap: only the granted devices --------------------------------------------------------

BWRAP = BwrapBackend.probe() if os.geteuid() == 0 else "needs root"
LISTING = (
    "ls /dev; echo ---; env | grep -E '^(CUDA_VISIBLE_DEVICES|TANGRAM_GPUS|CUDA_DEVICE_ORDER)=' "
    "| sort; echo ---; cat /sandbox/mark; echo ---; "
    "python3 -c 'import os; print(sorted(os.listdir(\"/proc/self/fd\")))'"
)


@pytest.fixture
def device_dir() -> Iterator[str]:
    """Fake device nodes of a 4-GPU machine (character devices, major 195 as NVIDIA's; there
    is no driver behind them: the test only looks at what the sandbox can see)."""
    d = tempfile.mkdtemp(prefix="tangram-fake-dev-")
    for minor, name in enumerate(["nvidia0", "nvidia1", "nvidia2", "nvidia3"]):
        os.mknod(f"{d}/{name}", stat.S_IFCHR | 0o666, os.makedev(195, minor))
    os.mknod(f"{d}/nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    os.mknod(f"{d}/nvidia-uvm", stat.S_IFCHR | 0o666, os.makedev(511, 0))
    yield d
    for f in os.listdir(d):
        os.unlink(f"{d}/{f}")
    os.rmdir(d)


def parts(stdout: str) -> tuple[set[str], dict[str, str], str, list[str]]:
    dev, variables, mark, fds = stdout.split("---\n")
    return (
        {n for n in dev.split() if n.startswith("nvidia")},
        dict(line.split("=", 1) for line in variables.split()),
        mark.strip(),
        json.loads(fds.replace("'", '"')),
    )


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap backend: {BWRAP}")
@pytest.mark.parametrize("spawner", [True, False], ids=["spawner", "nsenter"])
def test_bwrap_binds_exactly_the_granted_devices(device_dir: str, spawner: bool):
    async def main():
        cpu = CpuManager("bwrap", backend_options={"device_dir": device_dir, "spawner": spawner})
        async with Tangram(cpu=cpu, gpu=gpu_manager(4)) as tg:
            env = await tg.open_env("t", memory_mb=256)
            assert (await tg.exec(env, "echo here > /sandbox/mark")).ok
            plain = await tg.exec(env, LISTING, cpu=1)
            devices, variables, _, _ = parts(plain.stdout)
            assert plain.ok and devices == set() and variables == {}  # no grant: no GPU
            r = await tg.exec(env, LISTING, cpu=2, gpus=2)
            assert r.ok, (r.detail, r.stderr)
            assert r.units == {"cpu": 2, "gpu": 2}
            s, e = r.placement["gpu"].chunk
            devices, variables, mark, fds = parts(r.stdout)
            assert devices == {*(f"nvidia{i}" for i in range(s, e)), "nvidiactl", "nvidia-uvm"}
            assert variables == {
                "TANGRAM_GPUS": ",".join(map(str, range(s, e))),
                "CUDA_VISIBLE_DEVICES": "0,1",  # the driver numbers what it can open from 0
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            }
            assert mark == "here"  # the environment's own files
            assert fds == ["0", "1", "2", "3"]  # nothing of the launcher's (3: listdir's own)

            # a grant off GPU 0: the manager handed an assignment of GPUs 2 and 3 directly
            r = await run_granted(tg, env, LISTING, (2, 4))
            devices, variables, _, _ = parts(r.stdout)
            assert r.ok and devices == {"nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"}
            assert variables["TANGRAM_GPUS"] == "2,3" and variables["CUDA_VISIBLE_DEVICES"] == "0,1"

            os.unlink(f"{device_dir}/nvidia3")  # a granted GPU with no node: named, not run
            r = await run_granted(tg, env, LISTING, (2, 4))
            assert r.status is Status.FAILED
            assert r.detail.startswith("gpus:") and "nvidia3" in r.detail
            os.mknod(f"{device_dir}/nvidia3", stat.S_IFCHR | 0o666, os.makedev(195, 3))

    run(main())


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap backend: {BWRAP}")
def test_bwrap_device_sandbox_is_in_the_environments_processes(device_dir: str):
    """The command granted GPUs shares the environment's PID namespace: it sees what an
    earlier command of the environment left running, and not the host's processes."""

    async def main():
        cpu = CpuManager("bwrap", backend_options={"device_dir": device_dir})
        async with Tangram(cpu=cpu, gpu=gpu_manager(4)) as tg:
            env = await tg.open_env("t", memory_mb=256)
            inside = await tg.exec(env, "echo $$; cat /proc/1/cmdline | tr '\\0' ' '", gpus=1)
            assert inside.ok, inside.detail
            pid, init = inside.stdout.splitlines()
            assert "bwrap --args" in init  # PID 1: the environment's sandbox, not the host's
            assert int(pid) < 100  # a small PID: the sandbox's namespace

    run(main())


@pytest.mark.skipif(seccomp.unavailable() is not None, reason=f"{seccomp.unavailable()}")
def test_both_seccomp_loaders_pass_the_command_no_descriptor_above_2(tmp_path):
    """What a launcher passed on (nsenter's /proc/<holder> directory, a device sandbox's PID
    namespace) never reaches the command, whichever loader runs it."""
    filt, native = seccomp.install(tmp_path)
    loaders = [[sys.executable, "-I", "-S", str(tmp_path / seccomp.LOADER_NAME)]]
    if native:
        loaders.append([str(tmp_path / seccomp.NATIVE_NAME)])
    held = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for loader in loaders:
            done = subprocess.run(
                [*loader, str(filt), "65536", "ls", "/proc/self/fd"],
                pass_fds=(held,),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["0", "1", "2", "3"], (loader, done.stdout)
    finally:
        os.close(held)


# -- (d) HTTP and the client --------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[str, Tangram]]:
    tg = Tangram(cpu=instant_cpu(), gpu=gpu_manager(2))
    with serve_in_thread(create_app(tg)) as url:
        yield url, tg


def test_http_and_the_client_pass_gpus(served: tuple[str, Tangram]) -> None:
    url, tg = served

    async def main():
        async with TangramClient(url) as client:
            env = await client.open_env("t", memory_mb=64)
            r = await client.exec(env, "x", cpu=2, gpus=1)
            assert r.ok and r.units == {"cpu": 2, "gpu": 1}
            assert r.placement["gpu"].chunk is not None and r.placement["gpu"].node == "gpu0"
            r = await client.exec(env, "x", cpu=1, gpus=(1, 2))  # a range, as invoke's
            assert r.ok and r.units["gpu"] in (1, 2)
            with pytest.raises(ValidationError) as bad:
                await client.exec(env, "x", gpus=3)
            assert bad.value.field == "gpus"
            assert (await client.exec(env, "x")).units == {"cpu": 1}

    run(main())
    assert len(tg.cpu.backend.gpu_grants) == 2  # the two vector execs, and only those


def test_http_without_a_gpu_pool_answers_4xx_naming_gpus() -> None:
    tg = Tangram(cpu=instant_cpu())
    with serve_in_thread(create_app(tg)) as url:
        env = httpx.post(f"{url}/v1/envs", json={"trajectory": "t"}).json()["env_id"]
        r = httpx.post(f"{url}/v1/envs/{env}/exec", json={"command": "x", "gpus": 1})
        assert 400 <= r.status_code < 500 and r.json()["field"] == "gpus", r.text
        r = httpx.post(f"{url}/v1/envs/{env}/exec", json={"command": "x", "gpus": "one"})
        assert r.status_code == 422 and r.json()["field"].startswith("gpus"), r.text


# -- (e) /run_code's GPU languages ------------------------------------------------------------


class UnsimulatedGpu(SimGpuBackend):
    """A GPU backend that does not say it is simulated: the server believes it has GPUs."""

    name = "test-gpu"


def run_code(url: str, language: str, code: str) -> dict:
    body = {"language": language, "code": code, "run_timeout": 30, "compile_timeout": 30}
    return httpx.post(f"{url}/run_code", json=body, timeout=120).json()


def test_gpu_languages_without_a_gpu_answer_sandbox_error() -> None:
    for gpu in (None, gpu_manager(1)):  # no GPU pool; a simulated one
        tg = Tangram(cpu=instant_cpu(), gpu=gpu)
        with serve_in_thread(create_app(tg)) as url:
            for language in ("python_gpu", "cuda"):
                doc = run_code(url, language, "print(1)")
                assert doc["status"] == "SandboxError", doc
                assert doc["message"].startswith(f"{language} needs a GPU: this server")
                assert ("simulated" if gpu else "no GPU pool") in doc["message"]
                assert doc["run_result"] is None
            assert tg.cpu.backend.execs == []  # nothing ran


@pytest.mark.skipif(AffinityBackend.probe() is not None, reason="affinity backend")
def test_gpu_languages_run_with_a_gpu_granted() -> None:
    workdir = tempfile.mkdtemp(prefix="tangram-vx-")
    tg = Tangram(
        cpu=CpuManager(AffinityBackend(), workdir_root=workdir),
        gpu=gpu_manager(2, backend=UnsimulatedGpu(time_scale=0)),
    )
    with serve_in_thread(create_app(tg)) as url:
        code = "import os; print(os.environ['TANGRAM_GPUS'], os.environ['CUDA_VISIBLE_DEVICES'])"
        doc = run_code(url, "python_gpu", code)
        assert doc["status"] == "Success", doc
        gpus, visible = doc["run_result"]["stdout"].split()
        assert re.fullmatch(r"[01]", gpus) and visible == gpus  # no isolation: host indices
        doc = run_code(url, "python", "import os; print(os.environ.get('TANGRAM_GPUS'))")
        assert doc["run_result"]["stdout"].strip() == "None"  # python gets no GPU
        if not any(os.access(f"{p}/nvcc", os.X_OK) for p in os.environ["PATH"].split(":")):
            doc = run_code(url, "cuda", "int main() { return 0; }")
            assert doc["status"] == "SandboxError" and "nvcc" in doc["message"], doc
    os.rmdir(workdir)


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap backend: {BWRAP}")
def test_python_gpu_on_bwrap_sees_its_one_gpu(device_dir: str) -> None:
    tg = Tangram(
        cpu=CpuManager("bwrap", backend_options={"device_dir": device_dir}),
        gpu=gpu_manager(4, backend=UnsimulatedGpu(time_scale=0)),
    )
    with serve_in_thread(create_app(tg)) as url:
        code = (
            "import os\n"
            "print(os.environ['TANGRAM_GPUS'], os.environ['CUDA_VISIBLE_DEVICES'])\n"
            "print(sorted(n for n in os.listdir('/dev') if n.startswith('nvidia')))\n"
        )
        doc = run_code(url, "python_gpu", code)
        assert doc["status"] == "Success", doc
        first, second = doc["run_result"]["stdout"].splitlines()
        gpu, visible = first.split()
        assert visible == "0" and gpu in "0123"
        assert set(json.loads(second.replace("'", '"'))) == {
            f"nvidia{gpu}",
            "nvidia-uvm",
            "nvidiactl",
        }


def _images_reason() -> str | None:
    if BWRAP is not None:
        return BWRAP
    with tempfile.TemporaryDirectory() as d:
        return LayerStore(d).why_not


@pytest.mark.skipif(_images_reason() is not None, reason=f"images: {_images_reason()}")
def test_an_image_environments_gpu_command_sees_the_image_and_its_gpu(device_dir: str) -> None:
    """With an image as its root, the device sandbox is the image's tree (its /tmp, in the
    environment's layer, shared with the environment's other commands) plus the granted GPU."""
    state = tempfile.mkdtemp(prefix="tangram-vx-img-")
    os.chmod(state, 0o755)
    build(ImageStore(f"{state}/images"), "tools", [{"host": {"programs": ["sh", "ls", "cat"]}}])

    async def main():
        cpu = CpuManager("bwrap", state_dir=state, backend_options={"device_dir": device_dir})
        async with Tangram(cpu=cpu, gpu=gpu_manager(4)) as tg:
            env = await tg.open_env("img", memory_mb=256, image="tools", disk_mb=32)
            r = await tg.exec(env, "echo mark > /tmp/t; ls /dev", gpus=1)
            assert r.ok, (r.detail, r.stderr)
            g = r.placement["gpu"].chunk[0]
            assert {n for n in r.stdout.split() if n.startswith("nvidia")} == {
                f"nvidia{g}",
                "nvidiactl",
                "nvidia-uvm",
            }
            assert (await tg.exec(env, "cat /tmp/t")).stdout == "mark\n"  # the same /tmp

    try:
        run(main())
    finally:
        unmount_below(Path(state))
        shutil.rmtree(state, ignore_errors=True)
