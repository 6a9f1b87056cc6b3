"""`tangram bench exec`: the per-exec overhead of the CPU backends, for `true`.

Prints the median of N runs of: the raw command (`subprocess.run`), the same command as a
Tangram action on the `cgroup` backend and on the `bwrap` backend (cgroup grant + a bubblewrap
sandbox per environment; commands started by its resident spawner, and, for reference, entered
per exec with nsenter + setpriv), a raw `exec_run` through the docker SDK, and the action on
the `docker` backend; with the grant unchanged between runs and alternating between two grants
(which forces a cpuset/quota rewrite per exec). All in one run, so the figures share one
machine state.
Goals: cgroup and bwrap <= raw + 2 ms; docker <= 1.2 x raw exec_run. A backend that cannot run
here is reported with its reason.
Run as root, it also measures the bwrap backend rootless in the same run (as the unprivileged
user of `.ci/rootless.sh`: subordinate uids, a delegated cgroup subtree; `as_user`), beside
root's bwrap; goal: rootless <= 1.2 x root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from evaluation.benches import as_user, cgroup_move
from managers.cpu.backends import create
from managers.cpu.backends.docker import DockerBackend
from managers.cpu.manager import CpuManager
from managers.cpu.request import ExecRequest
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import BackendUnavailable
from tangram.pools import Placement
from tangram.resources import Demand
from tangram.results import Status


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


async def _time_async(n: int, fn: Callable[[int], Awaitable[object]]) -> float:
    samples = []
    for i in range(n):
        t = time.perf_counter()
        await fn(i)
        samples.append(time.perf_counter() - t)
    return _median_ms(samples)


async def _paired(n: int, fn: Callable[[int], Awaitable[object]]) -> tuple[float, float, float]:
    """Each sample: the raw command, then the action, back to back (one machine state for
    both, on a loaded machine). Returns the medians of raw, of ours and of ours - raw."""
    raw, ours, diff = [], [], []
    for i in range(n):
        t = time.perf_counter()
        subprocess.run(["true"], check=True)
        t1 = time.perf_counter()
        await fn(i)
        t2 = time.perf_counter()
        raw.append(t1 - t)
        ours.append(t2 - t1)
        diff.append(t2 - t1 - (t1 - t))
    return _median_ms(raw), _median_ms(ours), _median_ms(diff)


async def _action_ms(
    backend: str, n: int, alternate: bool, paired: bool = False, **options
) -> float | tuple[float, float, float]:
    m = CpuManager(create(backend, **options))
    await m.start()
    try:
        env_id = await m.open_env(f"bench-{uuid.uuid4().hex[:6]}", 256)
        env = m.envs.get(env_id)
        assert env is not None
        node = env.node
        cores = sorted(m.pool.cpu_node(node).domain_of)
        grants = [(cores[0],), tuple(cores[:2])] if alternate and len(cores) > 1 else [(cores[0],)]
        request = ExecRequest(env_id, ("true",))

        async def one(i: int) -> None:
            grant = grants[i % len(grants)]
            placement = Placement(node, cores=grant)
            action = Action(
                f"b{i}",
                {"cpu": Demand.fixed(len(grant))},
                trajectory=env.trajectory,
                payload=request,
            )
            m.pool.take(placement, len(grant))
            try:
                o = await m.run(Assignment(action, {"cpu": len(grant)}, {"cpu": placement}))
            finally:
                m.pool.release(placement, len(grant))
            if o.status is not Status.OK:
                raise RuntimeError(f"{backend}: `true` did not succeed: {o.detail}")

        await one(0)  # warm up (slot creation, connections)
        return await (_paired(n, one) if paired else _time_async(n, one))
    finally:
        await m.close()


def _raw_subprocess_ms(n: int) -> float:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(["true"], check=True)
        samples.append(time.perf_counter() - t)
    return _median_ms(samples)


def _raw_exec_run_ms(n: int, image: str | None) -> float:
    backend = DockerBackend(image=image)
    asyncio.run(backend.start())
    c = backend.client.containers.run(
        backend.image, ["sleep", "1000000000"], detach=True, network_mode="none"
    )
    try:
        c.exec_run(["true"])
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            c.exec_run(["true"])
            samples.append(time.perf_counter() - t)
        return _median_ms(samples)
    finally:
        c.remove(force=True)
        asyncio.run(backend.shutdown())


def _interleaved(n: int, rounds: int) -> int:
    """Each round measures every variant once, each sample paired with a raw run just before
    it (the overhead is the median of the pairs' differences: robust on a loaded machine)."""
    variants = (
        ("bwrap", "bwrap", {}),
        ("bwrap (nsenter)", "bwrap", {"spawner": False}),
        ("cgroup", "cgroup", {}),
    )
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for r in range(rounds):
        parts = []
        for label, backend, options in variants:
            try:
                raw, ours, diff = asyncio.run(
                    _action_ms(backend, n, alternate=True, paired=True, **options)
                )
            except BackendUnavailable as exc:
                parts.append(f"{label} unavailable ({exc})")
                continue
            parts.append(f"{label} {ours:.2f} ms vs raw {raw:.2f} ms (paired +{diff:.2f} ms)")
        print(f"round {r + 1}: " + "; ".join(parts))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tangram bench exec",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--runs", type=int, default=200, help="runs per figure (200)")
    parser.add_argument("--image", default=None, help="docker image (TANGRAM_DOCKER_IMAGE)")
    parser.add_argument("--measure", choices=("bwrap",), help=argparse.SUPPRESS)
    parser.add_argument("--alternate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="instead: R rounds of bwrap (spawner), bwrap (nsenter) and cgroup, "
        "alternating grants, each sample paired with a raw run; one line "
        "per round",
    )
    return parser


def _rootless_rows(n: int, same: float, alt: float) -> list[tuple[str, str]]:
    """The bwrap backend as the unprivileged user, beside root's figures (`same`, `alt`)."""
    try:
        argv = ["-m", "evaluation.benches.cpu_exec", "-n", str(n), "--measure", "bwrap"]
        r_same = float(as_user.run_json(argv))  # type: ignore[arg-type]
        r_alt = float(as_user.run_json([*argv, "--alternate"]))  # type: ignore[arg-type]
    except (RuntimeError, ValueError) as exc:
        print(f"bwrap rootless unavailable: {exc}")
        return []
    for what, ours, root in (("same grant", r_same, same), ("alternating grants", r_alt, alt)):
        label = f"bwrap rootless action, {what}"
        print(f"{label:44s} {ours:8.2f} ms  ({ours / root:.2f}x root's bwrap)")
    worst = max(r_same / same, r_alt / alt)
    return [("bwrap rootless <= 1.2 x root", "met" if worst <= 1.2 else f"MISSED ({worst:.2f}x)")]


def _print_move() -> None:
    moved = cgroup_move.move_after_idle_ms()
    if moved is not None:
        state = "on" if moved[1] else "off"
        print(
            f"{'a cgroup move after 50 ms idle':44s} {moved[0]:8.2f} ms  "
            f"(favordynmods {state}; each exec moves its command into its slot)"
        )


def _docker_rows(n: int, image: str | None) -> list[tuple[str, str]]:
    """The docker backend beside a raw exec_run through the SDK."""
    rows: list[tuple[str, str]] = []
    try:
        exec_run = _raw_exec_run_ms(n, image)
        print(f"{'raw exec_run (docker SDK)':44s} {exec_run:8.2f} ms")
        opts = {"image": image}
        same = asyncio.run(_action_ms("docker", n, alternate=False, **opts))
        alt = asyncio.run(_action_ms("docker", n, alternate=True, **opts))
        api = asyncio.run(
            _action_ms("docker", max(n // 4, 10), alternate=True, direct=False, **opts)
        )
        print(f"{'docker action, same grant':44s} {same:8.2f} ms  ({same / exec_run:.2f}x)")
        print(f"{'docker action, alternating grants':44s} {alt:8.2f} ms  ({alt / exec_run:.2f}x)")
        print(
            f"{'docker action, alternating, container.update':44s} {api:8.2f} ms  "
            f"({api / exec_run:.2f}x, {max(n // 4, 10)} runs)"
        )
        rows.append(
            (
                "docker <= 1.2 x raw exec_run",
                "met" if max(same, alt) <= 1.2 * exec_run else "MISSED",
            )
        )
    except BackendUnavailable as exc:
        print(f"docker backend unavailable: {exc}")
    return rows


def main(argv: list[str]) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    n = ns.runs
    if ns.measure:  # (the rootless child: one figure, as JSON)
        print(json.dumps(asyncio.run(_action_ms(ns.measure, n, alternate=ns.alternate))))
        return 0
    if ns.rounds:
        return _interleaved(n, ns.rounds)

    raw = _raw_subprocess_ms(n)
    print(f"{'raw subprocess (true)':44s} {raw:8.2f} ms")
    rows: list[tuple[str, str]] = []
    variants: list[tuple[str, str, dict]] = [
        ("cgroup", "cgroup", {}),
        ("bwrap", "bwrap", {}),
        ("bwrap (nsenter per exec)", "bwrap", {"spawner": False}),
    ]
    for label, backend, options in variants:
        try:
            same = asyncio.run(_action_ms(backend, n, alternate=False, **options))
            alt = asyncio.run(_action_ms(backend, n, alternate=True, **options))
        except BackendUnavailable as exc:
            print(f"{label} backend unavailable: {exc}")
            continue
        print(f"{label + ' action, same grant':44s} {same:8.2f} ms  ({same - raw:+.2f} ms)")
        print(f"{label + ' action, alternating grants':44s} {alt:8.2f} ms  ({alt - raw:+.2f} ms)")
        if label == "bwrap":
            rows += _rootless_rows(n, same, alt)
        rows.append(
            (
                f"{label} <= raw + 2 ms",
                "met"
                if max(same, alt) <= raw + 2
                else f"MISSED by {max(same, alt) - raw - 2:.2f} ms",
            )
        )
    rows += _docker_rows(n, ns.image)
    _print_move()
    for goal, verdict in rows:
        print(f"goal {goal}: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
