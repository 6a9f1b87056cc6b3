"""`tangram demo`: a small, real agentic-RL rollout on this machine, twice.

16 trajectories, each: a few turns of (simulated) LLM generation, each followed by a real shell
action in the trajectory's environment (write code and tests, run it, inspect it), one search
call against a rate-limited loopback API, then a real elastic reward: the generated pytest suite
run with `-n <granted cores>` (pytest-xdist), and an LLM-judge call on the GPU pool (simulated
when there is no GPU).

Run 1 goes through Tangram (cores granted per action, elastic DoP). Run 2 is trajectory-level
static allocation, as a Kubernetes pod per trajectory: each trajectory holds fixed cores for its
whole life, LLM generation included, and runs its commands (and its reward, at `-n <pod cores>`)
on them through the same CPU backend. The judge and search calls go through the same managers in
both runs. The table compares action completion time (ACT), step time and core utilisation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from evaluation import coding_rollout
from managers.cpu.request import ExecRequest
from tangram import Action, Assignment, Placement, Tangram
from tangram.runtime.ray import ray_session

SOLUTION = """
def work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total
"""

TEST = """
import solution

def test_{i}():
    assert solution.work({n}) >= 0
"""


# -- a rate-limited search API on loopback ----------------------------------------------------
class _SearchHandler(BaseHTTPRequestHandler):
    limit = 20.0  # requests per second, like a paid search API tier (docs/calibration.md §5)
    lock = threading.Lock()
    window: list[float] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        now = time.monotonic()
        with self.lock:
            self.window[:] = [t for t in self.window if now - t < 1.0]
            over = len(self.window) >= self.limit
            if not over:
                self.window.append(now)
        time.sleep(0.05)  # search latency
        code, doc = (
            (429, {"error": "rate limited"})
            if over
            else (200, {"results": [{"title": "tangram", "q": json.loads(body or b"{}").get("q")}]})
        )
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def start_search_api() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SearchHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/search"


# -- one rollout ------------------------------------------------------------------------------
@dataclass
class Stats:
    acts: list[float] = field(default_factory=list)  # per CPU action: queued + run (s)
    busy_core_s: float = 0.0
    rewards: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass(frozen=True)
class Plan:
    """What one trajectory does; the same plan drives both runs."""

    gen_s: tuple[float, ...]
    work: int
    tests: int


def make_plans(n: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    # generation dominates a trajectory's life, as in the paper (active ~47% of the time)
    return [
        Plan(tuple(rng.uniform(1.5, 3.0) for _ in range(3)), rng.randint(200_000, 400_000), 4)
        for _ in range(n)
    ]


def turn_commands(plan: Plan, py: str) -> list[str]:
    files = [f"cat > solution.py <<'EOF'\n{SOLUTION}\nEOF"]
    for i in range(plan.tests):
        files.append(f"cat > test_s{i}.py <<'EOF'\n{TEST.format(i=i, n=plan.work)}\nEOF")
    return [
        "\n".join(files),
        f"{py} -c 'import solution; print(solution.work(1000))'",
        "grep -c def solution.py test_*.py | tail -n 1",
    ]


async def trajectory(tg, i: int, plan: Plan, stats: Stats, run_cmd, py: str) -> None:
    for t, cmd in enumerate(turn_commands(plan, py)):
        await asyncio.sleep(plan.gen_s[t])  # the LLM generates the next tool call
        r = await run_cmd(cmd, False)
        if t == 1:
            s = await tg.call_api("search", {"q": f"trajectory {i}"})
            if not s.ok:
                stats.failures.append(f"search: {s.status} {s.detail}")
        if not r.ok:
            stats.failures.append(f"turn {t}: {r.status} {r.detail} {r.stderr[-200:]}")
    r = await run_cmd(f"{py} -m pytest -q -p no:cacheprovider", True)
    stats.rewards.append(1 if r.ok else 0)
    if not r.ok:
        stats.failures.append(f"reward: {r.status} {r.detail} {r.stdout[-300:]}")
    j = await tg.invoke("judge", {"token_ids": list(range(16)), "trajectory": i}, gpus=(1, 2))
    if not j.ok:
        stats.failures.append(f"judge: {j.status} {j.detail}")


def _record(stats: Stats, r, extra_wait: float = 0.0) -> None:
    stats.acts.append(r.queued_s + r.run_s + extra_wait)
    stats.busy_core_s += r.run_s * sum(r.units.values())


async def run_tangram(tg, plans: list[Plan], py: str, progress, task) -> Stats:
    stats = Stats()
    ncores = tg.cpu.pool.capacity()

    async def one(i: int, plan: Plan) -> None:
        env = await tg.open_env(f"demo-t{i}", memory_mb=256)
        try:

            async def run_cmd(cmd: str, elastic: bool):
                r = await tg.exec(
                    env, cmd, cpu=(1, ncores) if elastic else 1, elastic=elastic, timeout=120
                )
                _record(stats, r)
                return r

            await trajectory(tg, i, plan, stats, run_cmd, py)
        finally:
            await tg.close_env(env)
            progress.advance(task)

    t0 = time.monotonic()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(plans)))
    stats.wall_s = time.monotonic() - t0
    return stats


async def run_static(tg, plans: list[Plan], py: str, progress, task, pod_cores: int = 1) -> Stats:
    """A pod per trajectory: `pod_cores` fixed cores held from the trajectory's start to its
    end; a trajectory starts when a pod's cores are free (FIFO)."""

    stats = Stats()
    cpu = tg.cpu
    node = cpu.pool.nodes()[0]
    cores = sorted(cpu.pool.cpu_node(node).domain_of)
    pods: asyncio.Queue = asyncio.Queue()
    for k in range(0, len(cores) - pod_cores + 1, pod_cores):
        pods.put_nowait(tuple(cores[k : k + pod_cores]))

    async def one(i: int, plan: Plan) -> None:
        asked = time.monotonic()
        pod = await pods.get()
        wait = time.monotonic() - asked
        env = await cpu.open_env(f"static-t{i}", memory_mb=256)
        first = [True]
        try:

            async def run_cmd(cmd: str, elastic: bool):
                req = ExecRequest(env, cmd, 120.0, elastic)
                act = Action(
                    f"s{i}-{time.monotonic_ns()}",
                    {cpu.resource: len(pod)},
                    trajectory=f"static-t{i}",
                    payload=req,
                )
                t = time.monotonic()
                out = await cpu.run(
                    Assignment(
                        act, {cpu.resource: len(pod)}, {cpu.resource: Placement(node, cores=pod)}
                    )
                )
                r = out.granted(act.id, {cpu.resource: len(pod)}, {}, 0.0, time.monotonic() - t)
                _record(stats, r, wait if first[0] else 0.0)  # the pod wait delays turn 1
                first[0] = False
                return r

            await trajectory(tg, i, plan, stats, run_cmd, py)
        finally:
            await cpu.close_env(env)
            pods.put_nowait(pod)
            progress.advance(task)

    t0 = time.monotonic()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(plans)))
    stats.wall_s = time.monotonic() - t0
    return stats


def summarise(name: str, s: Stats, cores: int) -> dict:
    acts = sorted(s.acts)
    p99 = acts[min(len(acts) - 1, int(0.99 * (len(acts) - 1) + 0.5))] if acts else 0.0
    return {
        "run": name,
        "mean_act_s": statistics.fmean(acts) if acts else 0.0,
        "p99_act_s": p99,
        "step_time_s": s.wall_s,
        "core_utilisation": s.busy_core_s / (cores * s.wall_s) if s.wall_s else 0.0,
        "rewards_passed": sum(s.rewards),
        "failures": len(s.failures),
    }


def _runtime(
    ns: argparse.Namespace, services: dict, apis: dict, traced: bool = False
) -> tuple[contextlib.AbstractContextManager | None, Tangram]:
    """One run's runtime: over Ray (`--ray`; with the entered Ray session, for the caller to
    exit after) or local (no session)."""
    if ns.ray:
        session = ray_session(ns.ray)
        address, opts = session.__enter__()
        # each node's agent runs the CPU backend and a simulated GPU backend
        return session, Tangram.ray(
            address,
            services=services,
            apis=apis,
            gpu_backend="sim",
            gpus_per_node=2,
            trace=ns.trace if traced else None,
            **{"cpu_backend": ns.cpu_backend, **opts},
        )
    # the judge is a modelled stand-in (no weights): simulated, also on a
    # machine with GPUs (where the default would be the torch backend)
    return None, Tangram.local(
        cpu_backend=ns.cpu_backend,
        services=services,
        apis=apis,
        gpu={"backend": "sim"},
        trace=ns.trace if traced else None,  # Tangram's run, not the static baseline's
    )


async def _main(ns: argparse.Namespace) -> list[dict]:
    server, url = start_search_api()
    py = '"${TANGRAM_PYTHON:-python3}"'  # the server's own Python, as the sandbox sees it
    plans = make_plans(ns.trajectories, ns.seed)
    services = {
        "judge": {"memory_gb": 16, "dops": [1, 2], "infer_s": {1: 0.30, 2: 0.18}, "restore_s": 0.4}
    }
    apis = {
        "search": {
            "url": url,
            "method": "POST",
            "concurrency": 8,
            "quota": 15,
            "period_s": 1.0,
            "timeout_s": 10,
        }
    }
    console = Console(stderr=True)  # progress and warnings; stdout stays the table or JSON
    rows = []
    runs = ["tangram"] if ns.ray else ["tangram", "static"]
    try:
        with Progress(console=console, transient=False) as progress:
            for name in runs:
                if ns.only and name != ns.only:
                    continue
                session, tg = _runtime(ns, services, apis, traced=name == "tangram")
                try:
                    async with tg:
                        cores = tg.cpu.pool.capacity()
                        backend = getattr(tg.cpu, "backend", None)
                        isolated = bool(getattr(backend, "isolates", False))
                        task = progress.add_task(f"{name}: trajectories", total=len(plans))
                        runner = run_tangram if name == "tangram" else run_static
                        stats = await runner(tg, plans, py, progress, task)
                finally:
                    if session is not None:
                        session.__exit__(None, None, None)
                rows.append(
                    {
                        **summarise(name, stats, cores),
                        "cpu_backend": tg.cpu.backend_name,
                        "isolated": isolated,
                    }
                )
                for f in stats.failures[:5]:
                    console.print(f"[yellow]{name}: {f}[/yellow]")
    finally:
        server.shutdown()
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-backend",
        default="auto",
        help="auto | bwrap | cgroup | docker | affinity (default: the best available, "
        "bwrap where it runs)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write Tangram's run as a trace (Chrome's trace-event JSON: open it in "
        "ui.perfetto.dev): each action on the cores, GPUs and API slots it held, and each "
        "trajectory's waits",
    )
    p.add_argument("--only", choices=["tangram", "static"], help="run one of the two")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run over a Ray cluster: an address, or local:N[xC] to start N local "
        "nodes of C cores (sim backend); the static baseline is skipped",
    )
    p.add_argument(
        "--rollout",
        choices=["agentic", "coding"],
        default="agentic",
        help="agentic: the rollout above, twice (default); coding: the AI-coding "
        "rollout of evaluation.coding_rollout (a task image, a forked GRPO "
        "group of 8, the project's tests as the reward; bwrap backend)",
    )
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    if ns.rollout == "coding":
        out = coding_rollout.run(log=lambda line: None if ns.json else print(line))
        print(json.dumps(out) if ns.json else coding_rollout.render(out))
        return (
            0
            if all(s["reward"] == 1.0 for s in out["samples"] if s["patch"].startswith("fix"))
            else 1
        )
    if ns.trajectories < 1:
        p.error("--trajectories must be at least 1")
    rows = asyncio.run(_main(ns))
    if ns.json:
        print(json.dumps(rows))
        return 0
    t = Table(title=f"tangram demo: {ns.trajectories} trajectories on this machine")
    for c in (
        "run",
        "mean ACT (s)",
        "p99 ACT (s)",
        "step time (s)",
        "core utilisation",
        "rewards passed",
        "failures",
    ):
        t.add_column(c)
    for r in rows:
        t.add_row(
            r["run"],
            f"{r['mean_act_s']:.2f}",
            f"{r['p99_act_s']:.2f}",
            f"{r['step_time_s']:.1f}",
            f"{r['core_utilisation']:.0%}",
            str(r["rewards_passed"]),
            str(r["failures"]),
        )
    Console().print(t)
    first = rows[0]
    Console().print(
        f"Commands ran on the {first['cpu_backend']} CPU backend: "
        + (
            "each trajectory in a sandbox of its own."
            if first["isolated"]
            else "on the host as this user, NOT isolated (root and bubblewrap give the bwrap "
            "backend's sandboxes)."
        )
        + " Nothing is left behind: every environment, cgroup and work folder is removed at "
        "the end."
    )
    if len(rows) == 2:
        a, b = rows
        Console().print(
            f"Tangram vs static pods: mean ACT {b['mean_act_s'] / a['mean_act_s']:.1f}x"
            f" shorter, step time {b['step_time_s'] / a['step_time_s']:.1f}x shorter."
        )
    return 0 if all(r["failures"] == 0 for r in rows) else 1
