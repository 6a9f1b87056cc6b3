"""The Python API on this machine's real CPU backend and a simulated GPU pool."""

import asyncio

import pytest

from tangram import Infeasible, ShuttingDown, Tangram, ValidationError

SERVICES = {
    "judge": {"memory_gb": 16, "dops": [1, 2], "infer_s": {1: 0.05, 2: 0.03}, "restore_s": 0.05}
}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_exec_invoke_and_status():
    async def main():
        async with Tangram.local(services=SERVICES) as tg:
            env = await tg.open_env("t1", memory_mb=128)
            r = await tg.exec(env, "echo hello; nproc", cpu=1, timeout=30)
            assert r.ok and r.stdout.split()[0] == "hello"
            assert r.units == {"cpu": 1} and len(r.placement["cpu"].cores) == 1
            assert r.queued_s >= 0 and r.run_s > 0
            n = tg.cpu.pool.capacity()
            r = await tg.exec(env, "nproc", cpu=(1, n), elastic=True, timeout=30)
            assert r.ok and r.units["cpu"] == n  # alone on the machine: all cores
            if tg.status().cpu_backend in ("cgroup", "docker", "affinity"):
                assert int(r.stdout.split()[0]) == n  # the grant is enforced
            out = await tg.invoke("judge", {"token_ids": [1, 2]}, gpus=(1, 2))
            assert out.ok and out.units["gpu"] in (1, 2) and out.restore_s > 0
            again = await tg.invoke("judge", {"token_ids": [3]}, gpus=out.units["gpu"])
            assert again.ok and again.restore_s == 0  # resident now: no restore
            st = tg.status()
            assert st.pools["cpu"].free == n and st.queue == 0 and st.envs == 1
            # what runs says whether it isolates (bwrap, docker) or not (cgroup, affinity)
            assert st.cpu_isolates is (st.cpu_backend in ("bwrap", "docker"))
            assert st.to_dict()["cpu_isolates"] is st.cpu_isolates
            assert type(st).from_dict(st.to_dict()) == st
            assert b"tangram_act_seconds" in tg.metrics.render()
            await tg.close_env(env)

    run(main())


def test_failures_come_back_as_results():
    async def main():
        async with Tangram.local() as tg:
            env = await tg.open_env("t2", memory_mb=64)
            r = await tg.exec(env, "exit 3", cpu=1)
            assert r.status == "error" and r.exit_code == 3
            r = await tg.exec(env, "definitely-not-a-command-xyz", cpu=1)
            assert r.status == "error" and r.exit_code == 127
            r = await tg.exec(env, "sleep 30", cpu=1, timeout=0.5)
            assert r.status == "timeout"
            assert tg.cpu.pool.free() == tg.cpu.pool.capacity()  # cores came back
            r = await tg.exec(env, "true", cpu=1)
            assert r.ok

    run(main())


def test_bad_input_is_a_clear_error():
    async def main():
        async with Tangram.local(services=SERVICES) as tg:
            env = await tg.open_env("t3", memory_mb=64)
            with pytest.raises(ValidationError, match="env_id"):
                await tg.exec("env-nope", "true")
            with pytest.raises(ValidationError, match="cpu"):
                await tg.exec(env, "true", cpu=-1)
            with pytest.raises(Infeasible):
                await tg.exec(env, "true", cpu=10_000)
            with pytest.raises(ValidationError, match="timeout"):
                await tg.exec(env, "true", timeout=-1)
            with pytest.raises(ValidationError, match="service"):
                await tg.invoke("nope", {})
            with pytest.raises(ValidationError, match="gpus"):
                await tg.invoke("judge", {}, gpus=4)
            with pytest.raises(ValidationError, match="api"):
                await tg.call_api("nope", {})
            with pytest.raises(ValidationError, match="memory_mb"):
                await tg.open_env("t4", memory_mb=0)
            assert tg.status().queue == 0 and not tg.scheduler.running

    run(main())


def test_cancelled_caller_drops_its_queued_action():
    async def main():
        async with Tangram.local() as tg:
            n = tg.cpu.pool.capacity()
            env = await tg.open_env("t5", memory_mb=64)
            hog = asyncio.create_task(tg.exec(env, "sleep 1", cpu=n, timeout=10))
            await asyncio.sleep(0.2)
            waiter = asyncio.create_task(tg.exec(env, "echo late", cpu=1))
            await asyncio.sleep(0.1)
            assert tg.status().queue == 1
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert tg.status().queue == 0
            assert (await hog).ok

    run(main())


def test_shutdown_cancels_queued_and_closes_envs():
    async def main():
        tg = await Tangram.local().start()
        n = tg.cpu.pool.capacity()
        env = await tg.open_env("t6", memory_mb=64)
        hog = asyncio.create_task(tg.exec(env, "sleep 20", cpu=n, timeout=60))
        await asyncio.sleep(0.2)
        queued = asyncio.create_task(tg.exec(env, "true", cpu=1))
        await asyncio.sleep(0.1)
        await tg.shutdown(deadline=0.3)
        assert (await queued).status == "cancelled"
        assert (await hog).status in ("cancelled", "failed", "error", "timeout")
        assert tg.status().envs == 0 and tg.cpu.pool.free() == n
        with pytest.raises(ShuttingDown):
            await tg.open_env("t7")

    run(main())


def test_yaml_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("gpu:\n  gpus_per_node: 6\n")
    with pytest.raises(ValidationError, match=r"gpu\.gpus_per_node"):
        Tangram.from_config(bad)
    bad.write_text("policy: {name: heuristic, deep: 3}\n")
    with pytest.raises(ValidationError, match=r"policy\.deep"):
        Tangram.from_config(bad)
    bad.write_text("gpu:\n  services:\n    judge: {memory_gb: 16, dops: [3]}\n")
    with pytest.raises(ValidationError, match=r"gpu\.services\.judge"):
        Tangram.from_config(bad)
    bad.write_text("cpus: {}\n")
    with pytest.raises(ValidationError, match="cpus"):
        Tangram.from_config(bad)
    good = tmp_path / "ok.yaml"
    good.write_text(
        "policy: {name: heuristic, depth: 3}\ncpu: {backend: auto}\n"
        "gpu: {nodes: 2, gpus_per_node: 4, services: {rm: {memory_gb: 8}}}\n"
    )
    tg = Tangram.from_config(good)
    assert tg.scheduler.pools["gpu"].capacity() == 8
    asyncio.run(tg.shutdown())
