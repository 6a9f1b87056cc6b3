"""verl's own code, unmodified, against a real `tangram serve` on loopback: its tool loader
builds `TangramTool` from a tool_config YAML, and its SandboxFusion reward client
(`check_correctness`) scores programs through our `/run_code`.

verl is installed without its heavy dependencies (`.ci/run`); where it does not import, these
tests skip and say why.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.affinity import AffinityBackend
from tangram.adapters import verl as adapter
from tangram.runtime.facade import Tangram
from tangram.runtime.sandboxfusion import DEFAULT_MEMORY_MB
from tangram.runtime.sandboxfusion.warm import warm_pool
from tangram.runtime.server import create_app, serve_in_thread

tool_registry = pytest.importorskip(
    "verl.tools.tool_registry", reason="verl's tool loader does not import"
)
sandbox_fusion = pytest.importorskip(
    "verl.utils.reward_score.sandbox_fusion.utils",
    reason="verl's SandboxFusion client does not import",
)
pytestmark = pytest.mark.skipif(
    AffinityBackend.probe() is not None, reason=f"affinity backend: {AffinityBackend.probe()}"
)
TOKEN = "verl-token"

TOOLS_YAML = """
tools:
  - class_name: tangram.adapters.verl.TangramTool
    config:
      type: native
      tangram: {{url: "{url}", token: "{token}"}}
      command_param: command
      cpu: [1, 2]
      timeout: 20
      memory_mb: 64
      reward_command: "python3 -c 'import answer; assert answer.VALUE == 42'"
      reward_cpu: [1, 2]
    tool_schema:
      type: function
      function:
        name: bash
        description: Run a shell command in the task's sandbox.
        parameters:
          type: object
          properties: {{command: {{type: string, description: the command}}}}
          required: [command]
"""


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Tangram]]:
    workdir = tempfile.mkdtemp(prefix="tangram-verl-test-")
    tg = Tangram(cpu=CpuManager(AffinityBackend(), workdir_root=workdir))
    with serve_in_thread(create_app(tg, TOKEN)) as url:
        yield url, tg
    shutil.rmtree(workdir, ignore_errors=True)


def test_tool_from_verls_loader_runs_a_trajectory(server, tmp_path: Path):
    url, tg = server
    config = tmp_path / "tools.yaml"
    config.write_text(TOOLS_YAML.format(url=url, token=TOKEN))
    (tool,) = tool_registry.initialize_tools_from_config(str(config))
    assert isinstance(tool, adapter.TangramTool) and tool.name == "bash"

    async def trajectory() -> None:
        iid, _ = await tool.create("verl-traj-1")
        assert tg.status().envs == 1  # the environment is the server's
        assert await tool.calc_reward(iid) == 0.0  # no answer yet
        resp, reward, metrics = await tool.execute(
            iid, {"command": "echo 'VALUE = 42' > answer.py && cat answer.py"}
        )
        assert "[ok, exit 0]" in resp.text and "VALUE = 42" in resp.text
        assert metrics["status"] == "ok" and 1 <= metrics["cores"] <= 2
        assert len(metrics["core_ids"]) == metrics["cores"]
        assert await tool.calc_reward(iid) == 1.0  # the file persists in the trajectory's env
        failed, _, m = await tool.execute(iid, {"command": "exit 7"})
        assert "exit 7" in failed.text and m["status"] == "error"
        await tool.release(iid)

    try:
        asyncio.run(trajectory())
        assert tg.status().envs == 0
    finally:
        adapter.close_shared()


@pytest.fixture(scope="module")
def run_code_url(server) -> str:
    return f"{server[0]}/run_code?token={TOKEN}"  # verl's client sends no Authorization header


SOLUTION = "a, b = map(int, input().split())\nprint(a + b)\n"
CASES = {"inputs": ["1 2\n", "20 22\n", "-5 5\n"], "outputs": ["3\n", "42\n", "0\n"]}


@pytest.mark.parametrize(
    "generation, expected",
    [
        (SOLUTION, [True, True, True]),  # right answer
        ("a, b = map(int, input().split())\nprint(a - b)\n", [False, False, False]),  # wrong answer
        ("raise SystemExit('boom') if input() else None\n", [-2, -2, -2]),  # runtime error
        ("import time\ntime.sleep(60)\n", [-3, -3, -3]),  # time limit
    ],
)
def test_verls_check_correctness_gets_its_own_codes(server, run_code_url, generation, expected):
    results, metadata = sandbox_fusion.check_correctness(
        run_code_url, CASES, generation, timeout=2, memory_limit_mb=256
    )
    assert results == expected, [m.get("status") for m in metadata]
    # no environment left open but the warm pool's never-used sandboxes (refilled off the
    # critical path: let the refill settle)
    pool = warm_pool(server[1], DEFAULT_MEMORY_MB)
    for _ in range(200):
        if pool is None or not pool.filling:
            break
        time.sleep(0.05)
    idle = pool.idle if pool is not None else 0
    assert server[1].status().envs == idle


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_verls_check_correctness_cpp(run_code_url):
    ok = '#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<"\\n";}'
    assert sandbox_fusion.check_correctness(run_code_url, CASES, ok, timeout=10, language="cpp")[
        0
    ] == [True, True, True]
    broken = "int main( {"
    assert sandbox_fusion.check_correctness(
        run_code_url, CASES, broken, timeout=10, language="cpp"
    )[0] == [-4, -4, -4]


def test_wrong_token_is_an_api_error_for_verl(server):
    results, _ = sandbox_fusion.check_correctness(
        f"{server[0]}/run_code?token=nope", CASES, SOLUTION, timeout=2
    )
    assert results == [-1, -1, -1]
    assert httpx.get(f"{server[0]}/healthz").json() == {"ok": True}
