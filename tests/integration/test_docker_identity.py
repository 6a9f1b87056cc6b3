"""Issue 22, finding 1 for the Docker backend: its containers carry the same seccomp rules
(each blocked call tried inside a container under the profile, with the host's Python bound
in, since the test image has none) and every environment gets a uid of its own."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from test_kernel_identity import PROBE, numbers  # the same probe (rootdir import mode)

from managers.cpu import CpuManager, ExecRequest, seccomp
from managers.cpu.backends.docker import DockerBackend

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("need_docker")]


def test_each_blocked_call_fails_under_the_docker_profile(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(seccomp.docker_profile())
    image = DockerBackend(max_concurrent=1)
    asyncio.run(image.start())
    name = image.image
    asyncio.run(image.shutdown())
    done = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--user",
            "65534:65534",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--security-opt",
            f"seccomp={profile}",
            "-v",
            "/usr:/usr:ro",
            "-v",
            "/lib:/lib:ro",
            "-v",
            "/lib64:/lib64:ro",
            name,
            "/usr/bin/python3",
            "-I",
            "-S",
            "-c",
            PROBE,
            json.dumps(numbers()),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0 and "python3" in done.stderr:
        pytest.skip(f"the host's python3 does not run in {name}: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {k: v for k, v in out.items() if k in seccomp.BLOCKED and v != 1} == {}
    assert out["clone(CLONE_NEWUSER)"] == 1 and out["clone3"] == 38


def test_the_backend_applies_the_profile_and_a_uid_per_environment():
    async def go():
        backend = DockerBackend()
        m = CpuManager(backend)
        await m.start()
        try:
            a = await m.open_env("a", 64)
            b = await m.open_env("b", 64)
            uids = [
                (await m.execute(ExecRequest(e, "cat /proc/self/status"))).stdout for e in (a, b)
            ]
            opts = backend.api.inspect_container(m.sandbox(a).id)["HostConfig"]
            return uids, opts["SecurityOpt"]
        finally:
            await m.close()

    uids, opts = asyncio.run(go())
    found = [next(ln.split()[1] for ln in s.splitlines() if ln.startswith("Uid:")) for s in uids]
    assert found[0] != found[1] and all(int(u) >= 2_000_000 for u in found)
    assert f"seccomp={seccomp.docker_profile()}" in opts
