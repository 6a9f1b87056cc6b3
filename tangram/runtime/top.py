"""`tangram top [--url URL] [--token T] [--interval S] [--once]`: a live view of a running
`tangram serve`, from its HTTP API (`/v1/status` and `/metrics`): each pool's units busy of its
capacity, per node; the queue and what runs; the finished actions by kind and status with their
mean queue wait and ACT since the view started; the backends and whether the GPU pool is
simulated. `--once` prints one frame (what a script or a test reads) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tangram.runtime.client import TangramClient
from tangram.runtime.status import StatusSnapshot


@dataclass
class Finished:
    """From `/metrics`: finished actions, and their summed queue waits and ACTs, by kind and
    status (Prometheus counters: a view shows what changed since its first frame)."""

    count: dict[tuple[str, str], float] = field(default_factory=dict)
    queued: dict[str, float] = field(default_factory=dict)  # kind -> seconds summed
    act: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)  # kind -> count in the histograms

    @classmethod
    def parse(cls, text: str) -> Finished:
        out = cls()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                kind = s.labels.get("kind", "")
                if s.name == "tangram_actions_total":
                    out.count[(kind, s.labels.get("status", ""))] = s.value
                elif s.name == "tangram_queued_seconds_sum":
                    out.queued[kind] = s.value
                elif s.name == "tangram_act_seconds_sum":
                    out.act[kind] = s.value
                elif s.name == "tangram_act_seconds_count":
                    out.done[kind] = s.value
        return out

    def since(self, first: Finished) -> Finished:
        def minus(a: dict, b: dict) -> dict:
            return {k: v - b.get(k, 0.0) for k, v in a.items() if v - b.get(k, 0.0) > 0}

        return Finished(
            minus(self.count, first.count),
            minus(self.queued, first.queued),
            minus(self.act, first.act),
            minus(self.done, first.done),
        )


def frame(
    url: str, status: StatusSnapshot, finished: Finished, since: str = "the view started"
) -> Group:
    """One frame of the view."""
    head = Text(
        f"tangram top  {url}  policy {status.policy}  cpu {status.cpu_backend or '-'}"
        f"{' (not isolated)' if status.cpu_isolates is False else ''}  "
        f"gpu {status.gpu_backend or '-'}{' (simulated)' if status.gpu_simulated else ''}  "
        f"queue {status.queue}  running {status.running}  environments {status.envs}"
        f"{'  CLOSING' if status.closing else ''}",
        style="bold",
    )
    pools = Table(title="pools", expand=False)
    for c in ("pool", "node", "busy", "capacity", "utilisation"):
        pools.add_column(c, justify="left" if c in ("pool", "node") else "right")
    for name, p in sorted(status.pools.items()):
        pools.add_row(name, "all", str(p.busy), str(p.capacity), f"{p.utilisation:.0%}")
        for node, n in sorted(p.nodes.items()):
            busy = n.capacity - n.free
            util = 0.0 if n.capacity == 0 else busy / n.capacity
            pools.add_row("", node, str(busy), str(n.capacity), f"{util:.0%}")
    actions = Table(title=f"finished since {since}", expand=False)
    for c in ("kind", "status", "count", "mean queued (ms)", "mean ACT (ms)"):
        actions.add_column(c, justify="left" if c in ("kind", "status") else "right")
    for (kind, st), n in sorted(finished.count.items()):
        done = finished.done.get(kind, 0.0)
        q = 1000 * finished.queued.get(kind, 0.0) / done if done else 0.0
        a = 1000 * finished.act.get(kind, 0.0) / done if done else 0.0
        actions.add_row(kind, st, f"{n:.0f}", f"{q:.1f}", f"{a:.1f}")
    if not finished.count:
        actions.add_row("-", "-", "0", "-", "-")
    return Group(head, pools, actions)


async def snapshot(client: TangramClient) -> tuple[StatusSnapshot, Finished]:
    status, text = await asyncio.gather(client.status(), client.metrics())
    return status, Finished.parse(text)


async def run(url: str, token: str | None, interval: float, once: bool, console: Console) -> int:
    async with TangramClient(url, token=token) as client:
        status, first = await snapshot(client)
        if once:
            console.print(frame(url, status, first, "the server started"))
            return 0
        with Live(frame(url, status, Finished()), console=console, refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(interval)
                status, now = await snapshot(client)
                live.update(frame(url, status, now.since(first)))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram top", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8470", help="the server (default port)")
    p.add_argument("--token", default=os.environ.get("TANGRAM_TOKEN"), help="its token")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    ns = p.parse_args(argv)
    try:
        return asyncio.run(run(ns.url, ns.token, ns.interval, ns.once, Console()))
    except KeyboardInterrupt:
        return 0
