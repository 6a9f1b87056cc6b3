"""`TangramClient` against a live server: the same calls, the same Results and the same errors
as the in-process `Tangram`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.errors import (
    Infeasible,
    LimitReached,
    QueueFull,
    ShuttingDown,
    TangramError,
    ValidationError,
)
from tangram.results import Result
from tangram.runtime.client import TangramClient, _raise_for
from tangram.runtime.facade import Tangram
from tangram.runtime.http import errors as http_errors
from tangram.runtime.server import create_app, serve_in_thread

TOKEN = "client-token"


def sim_seconds(command, cores: int) -> float:
    words = command.split() if isinstance(command, str) else list(command)
    return float(words[1]) if words[:1] == ["sleep"] and len(words) > 1 else 0.0


@pytest.fixture
def served() -> Iterator[tuple[str, Tangram]]:
    tg = Tangram(cpu=CpuManager(SimCpuBackend(sim_seconds, time_scale=1.0)))
    with serve_in_thread(create_app(tg, token=TOKEN)) as url:
        yield url, tg


def run(coro):
    return asyncio.run(coro)


def test_same_calls_same_results(served: tuple[str, Tangram]) -> None:
    url, _ = served

    async def scenario() -> None:
        async with TangramClient(url, token=TOKEN) as tg:
            env = await tg.open_env("traj-1", memory_mb=128)
            r = await tg.exec(env, "true", cpu=1, timeout=5)
            assert isinstance(r, Result) and r.ok and r.units == {"cpu": 1}
            r = await tg.exec(env, ["pytest", "-q"], cpu=(1, 2), elastic=True)
            assert r.ok and 1 <= r.units["cpu"] <= 2 and r.act_s >= r.run_s
            r = await tg.exec(env, "true", cpu=[1, 2])
            assert r.ok
            status = await tg.status()
            assert status.envs == 1
            assert "tangram_act_seconds" in await tg.metrics()
            await tg.close_env(env)
            assert (await tg.status()).envs == 0

    run(scenario())


def test_errors_are_raised_as_tangram_raises_them(served: tuple[str, Tangram]) -> None:
    url, _ = served

    async def scenario() -> None:
        async with TangramClient(url, token=TOKEN) as tg:
            env = await tg.open_env("traj-1")
            with pytest.raises(Infeasible):
                await tg.exec(env, "true", cpu=99)
            with pytest.raises(ValidationError) as bad:
                await tg.exec(env, "true", timeout=-1)
            assert bad.value.field == "timeout" and bad.value.value == -1
            with pytest.raises(ValidationError) as bad:
                await tg.exec("env-missing", "true")
            assert bad.value.field == "env_id"
            with pytest.raises(ValidationError) as bad:
                await tg.call_api("search", {"q": 1})
            assert bad.value.field == "api"
            with pytest.raises(ValidationError):
                await tg.close_env("a/b")
        async with TangramClient(url, token="wrong") as tg:
            with pytest.raises(TangramError, match="401"):
                await tg.status()
        async with TangramClient("http://127.0.0.1:9", token=TOKEN) as tg:
            with pytest.raises(TangramError, match="no answer"):
                await tg.status()

    run(scenario())


def test_cancelled_call_cancels_its_queued_action(served: tuple[str, Tangram]) -> None:
    url, server_tg = served

    async def scenario() -> None:
        async with TangramClient(url, token=TOKEN) as tg:
            env = await tg.open_env("traj-1")
            hold = asyncio.create_task(tg.exec(env, "sleep 1", cpu=2))
            while (await tg.status()).running == 0:
                await asyncio.sleep(0.02)
            queued = asyncio.create_task(tg.exec(env, "sleep 0", cpu=1))
            while (await tg.status()).queue == 0:
                await asyncio.sleep(0.02)
            queued.cancel()
            for _ in range(100):
                if (await tg.status()).queue == 0:
                    break
                await asyncio.sleep(0.02)
            assert (await tg.status()).queue == 0
            assert (await hold).ok
            with pytest.raises(asyncio.CancelledError):
                await queued

    run(scenario())
    assert [c for _, _, c in server_tg.cpu.backend.execs] == ["sleep 1"]


def test_many_concurrent_clients_lose_nothing(served: tuple[str, Tangram]) -> None:
    url, _ = served

    async def scenario() -> list[Result]:
        async with TangramClient(url, token=TOKEN) as tg:
            envs = [await tg.open_env(f"t-{i}", memory_mb=16) for i in range(10)]
            return await asyncio.gather(*[tg.exec(envs[i % 10], "true") for i in range(200)])

    results = run(scenario())
    assert len(results) == 200 and all(r.ok for r in results)
    assert len({r.action_id for r in results}) == 200


@pytest.mark.parametrize(
    "exc, handler, raised",
    [
        (ShuttingDown("stopping"), "_shutting_down", ShuttingDown),
        (LimitReached("RLIMIT_NOFILE 16"), "_limit_reached", LimitReached),
        (QueueFull("2000 queued"), "_queue_full", QueueFull),
    ],
)
def test_a_busy_or_stopping_server_raises_the_servers_own_error(exc, handler, raised) -> None:
    """The server's 503s (shutting down; a host limit) and 429 come back as the errors the
    in-process `Tangram` raises, not as a plain `TangramError`: the bodies are the server's
    own handlers'."""
    answer = getattr(http_errors, handler)(None, exc)
    response = httpx.Response(answer.status_code, content=bytes(answer.body))
    with pytest.raises(raised, match=str(exc)):
        _raise_for(response)
