"""One engine: the runtime (`Tangram` on the `sim` CPU backend, on a virtual-time asyncio loop,
`evaluation.vclock`) and the closed-loop simulator (`evaluation.closedloop`) make the same
decisions for the same trajectories: every action starts at the same time with the same units.

The two share the scheduler, the policy, the estimator and its learning rule
(`DurationProfiles.as_seen`, `record`), the kinds (`exec_kind`) and the timeouts; this test
fails if any of them drifts apart (a runtime that learned only from successful runs, a
simulator that handed the scheduler the true E(m), a different default estimate...).

Event times are kept distinct (LLM gaps > 0, and a jitter of sqrt(prime) fractions on every
duration, whose sums never coincide): at one instant the simulator handles every event and
then decides once, the runtime decides after each event, and that is the one difference left.
"""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation import vclock
from evaluation.closedloop import EnvironmentStart, Policy, run
from evaluation.runtime_sim import run_on_runtime
from evaluation.workloads import get_workload
from evaluation.workloads.base import Step, Trajectory, Workload
from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.pools import CorePool
from tangram.profiles import exec_kind
from tangram.runtime.config import DEFAULT_POLICY
from tangram.runtime.facade import Tangram
from topology import CpuNode

PRIMES = [p for p in range(2, 2000) if all(p % q for q in range(2, int(p**0.5) + 1))]
SERIAL = 0.3
TIMEOUT = 1000.0


def jitter(i: int) -> float:
    return (math.sqrt(PRIMES[i]) % 1.0) * 1e-3


def duration(command, cores: int) -> float:
    """The sim backend's model: `sleep D` takes D; `work T` takes T's Amdahl time on cores."""
    word, x = command.split()
    t = float(x)
    return t if word == "sleep" else t * (SERIAL + (1 - SERIAL) / cores)


step = st.tuples(st.integers(1, 20), st.booleans(), st.integers(1, 4), st.integers(1, 30))
trajectory = st.tuples(st.integers(0, 6), st.lists(step, min_size=1, max_size=4))


def plan(raw, cores: int):
    """[(id, start, [(think, command, cpu, elastic)])] with distinct jittered times."""
    out, n = [], 0
    for i, (start, steps) in enumerate(raw):
        ss = []
        for think, elastic, k, work in steps:
            n += 2
            cmd = f"{'work' if elastic else 'sleep'} {work * 0.1 + jitter(n)!r}"
            cpu = (1, min(k, cores)) if elastic else min(k, cores)
            ss.append((think * 0.1 + jitter(n + 1), cmd, cpu, elastic))
        out.append((f"t{i}", start * 0.5 + jitter(n + 2), ss))
        n += 3
    return out


def cluster(nodes: int, cores: int) -> dict[str, CpuNode]:
    return {f"n{i}": CpuNode(f"n{i}", {0: tuple(range(cores))}) for i in range(nodes)}


async def on_runtime(trajs, nodes: int, cores: int, policy: str):
    loop = asyncio.get_running_loop()
    cpu = CpuManager(
        SimCpuBackend(duration, time_scale=1.0),
        nodes=cluster(nodes, cores),
        memory_mb={n: 1 << 20 for n in cluster(nodes, cores)},
    )
    tg = Tangram(cpu=cpu, policy=policy, clock=loop.time)
    await tg.start()
    t0 = loop.time()
    grants = {}

    async def one(tid, start, steps):
        await asyncio.sleep(start)
        env = await tg.open_env(tid, 16)
        for j, (think, cmd, cpu_, elastic) in enumerate(steps):
            await asyncio.sleep(think)
            submitted = loop.time() - t0
            r = await tg.exec(env, cmd, cpu=cpu_, elastic=elastic, timeout=TIMEOUT)
            assert r.ok, r
            grants[(tid, j)] = (submitted + r.queued_s, r.units["cpu"])
        await tg.close_env(env)

    await asyncio.gather(*(one(*t) for t in trajs))
    await tg.shutdown()
    return grants


def on_simulator(trajs, nodes: int, cores: int, policy: str):
    out = []
    for tid, start, steps in trajs:
        ss = []
        for j, (think, cmd, cpu_, elastic) in enumerate(steps):
            aid, t = f"{tid}.{j}", float(cmd.split()[1])
            if elastic:
                act = Action(
                    aid,
                    {"cpu": cpu_},
                    elasticity=Elasticity(
                        "cpu", t, lambda m: 1 / (m * (SERIAL + (1 - SERIAL) / m))
                    ),
                    trajectory=tid,
                    kind=exec_kind(tid, cmd),
                    timeout=TIMEOUT,
                )
            else:
                act = Action(
                    aid,
                    {"cpu": cpu_},
                    duration=t,
                    trajectory=tid,
                    kind=exec_kind(tid, cmd),
                    timeout=TIMEOUT,
                )
            ss.append(Step(think, act))
        out.append(Trajectory(tid, "t", start, tuple(ss)))

    def pools():
        return {"cpu": CorePool("cpu", cluster(nodes, cores))}

    w = Workload("prop", tuple(out), pools, None)
    r = run(w, Policy(policy, get_allocator(policy), EnvironmentStart(0.0)))
    return {
        (aid.rsplit(".", 1)[0], int(aid.rsplit(".", 1)[1])): (x.start, x.units["cpu"])
        for aid, x in r.records.items()
    }


@settings(max_examples=40, deadline=None)
@given(
    raw=st.lists(trajectory, min_size=1, max_size=5),
    nodes=st.integers(1, 2),
    cores=st.integers(1, 4),
    policy=st.sampled_from(["heuristic", "backfill-srpt", "min"]),
)
def test_runtime_on_virtual_time_grants_what_the_simulator_grants(raw, nodes, cores, policy):
    """Also on two nodes: both open a trajectory's environment by the CPU manager's rule."""
    trajs = plan(raw, cores)
    got = vclock.run(on_runtime(trajs, nodes, cores, policy))
    want = on_simulator(trajs, nodes, cores, policy)
    assert set(got) == set(want)
    for key in sorted(want):
        (s0, u0), (s1, u1) = got[key], want[key]
        assert u0 == u1 and abs(s0 - s1) < 1e-6, (key, got[key], want[key])


def test_coding_workload_on_the_runtime_engine_matches_the_simulator():
    """`evaluation.runtime_sim` (the workload through `Tangram` on virtual time) and the
    closed-loop engine agree action by action on a contended two-node coding run with the
    runtime's default policy. (The coding workload's reward arrives the instant its last tool
    call ends: with `heuristic` the runtime's extra decision between the two events can grant
    differently; this policy's grants do not depend on it here.)"""
    w = get_workload("coding", batch=16, nodes=2, cores_per_node=8, seed=1)
    e = run(w, Policy(DEFAULT_POLICY, get_allocator(DEFAULT_POLICY), EnvironmentStart(0.5)))
    r = run_on_runtime(w, DEFAULT_POLICY, 0.5)
    assert set(e.records) == set(r.records) and len(e.records) == w.num_actions
    for aid, x in e.records.items():
        y = r.records[aid]
        assert x.units == y.units and abs(x.start - y.start) < 1e-6, (aid, x, y)
