"""The verl adapter against verl's real `BaseTool` where verl imports, else its interface shape.

Commands run for real (the `affinity` backend: no root needed) on this machine's Tangram.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from managers.cpu.backends.affinity import AffinityBackend
from tangram.adapters import verl as adapter
from tangram.errors import ValidationError
from tangram.runtime.facade import Tangram

SCHEMA = {
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
pytestmark = pytest.mark.skipif(
    AffinityBackend.probe() is not None, reason=f"affinity backend: {AffinityBackend.probe()}"
)


def schema():
    if adapter.HAVE_VERL:
        from verl.tools.schemas import OpenAIFunctionToolSchema

        return OpenAIFunctionToolSchema.model_validate(SCHEMA)
    return SCHEMA


def text_of(response) -> str:
    return response if isinstance(response, str) else response.text


@pytest.fixture
def runner():
    r = adapter.TangramRunner(lambda: Tangram.local(cpu_backend="affinity"))
    yield r
    r.close()


def test_interface_is_verls():
    """Async create/execute/calc_reward/release with verl's parameters; a real subclass of
    verl's BaseTool when verl imports (else: say what blocked it)."""
    for name, params in {
        "create": ["instance_id"],
        "execute": ["instance_id", "parameters"],
        "calc_reward": ["instance_id"],
        "release": ["instance_id"],
    }.items():
        fn = getattr(adapter.TangramTool, name)
        assert inspect.iscoroutinefunction(fn), name
        assert list(inspect.signature(fn).parameters)[1 : 1 + len(params)] == params
    if adapter.HAVE_VERL:
        from verl.tools.base_tool import BaseTool

        assert issubclass(adapter.TangramTool, BaseTool)
    else:
        assert adapter.VERL_IMPORT_ERROR


def test_tool_lifecycle_runs_actions(runner):
    config = {
        "type": "native",
        "cpu": [1, 2],
        "timeout": 10,
        "memory_mb": 64,
        "reward_command": "test -f marker",
    }
    tool = adapter.TangramTool(config, schema(), runner=runner)
    assert tool.name == "bash"
    tg = runner.tangram

    async def main():
        created = await tool.create("traj-7")
        iid = created if isinstance(created, str) else created[0]
        assert iid == "traj-7" and runner.tangram.status().envs == 1
        assert await tool.calc_reward(iid) == 0.0  # no marker yet
        resp, reward, metrics = await tool.execute(iid, {"command": "echo hi && touch marker"})
        assert "hi" in text_of(resp) and "[ok, exit 0]" in text_of(resp)
        assert reward == 0.0 and metrics["status"] == "ok" and 1 <= metrics["cores"] <= 2
        assert metrics["node"] == tg.cpu.binding("traj-7")
        bad, _, m = await tool.execute(iid, {"cmd": "echo"})
        assert "non-empty 'command'" in text_of(bad) and m["status"] == "invalid"
        failed, _, m = await tool.execute(iid, {"command": "exit 3"})
        assert "exit 3" in text_of(failed) and m["status"] == "error"
        assert await tool.calc_reward(iid) == 1.0  # the marker is in this trajectory's env
        await tool.release(iid)
        assert runner.tangram.status().envs == 0
        with pytest.raises(ValidationError):
            await tool.execute(iid, {"command": "true"})

    asyncio.run(main())


def test_output_is_capped(runner):
    tool = adapter.TangramTool({"max_output": 50}, schema(), runner=runner)

    async def main():
        created = await tool.create()
        iid = created if isinstance(created, str) else created[0]
        resp, _, _ = await tool.execute(iid, {"command": "yes x | head -c 1000"})
        await tool.release(iid)
        return text_of(resp)

    out = asyncio.run(main())
    assert "more chars" in out and len(out) < 120


def test_compute_score_runs_the_tests_elastically():
    info = {"tangram": {"cpu_backend": "affinity"}, "test_command": "grep -q 42 solution.py"}
    try:
        assert adapter.compute_score("t", "answer = 42\n", None, info) == 1.0
        assert adapter.compute_score("t", "answer = 41\n", None, info) == 0.0
    finally:
        adapter.close_shared()
