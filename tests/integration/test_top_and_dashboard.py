"""What a user watches: `tangram top` renders a live server's state (its pools per node, the
queue, what finished by kind and status) from the HTTP API; the Grafana dashboard in docs/
parses and names only metrics the server exports."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
from rich.console import Console

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.runtime import top
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app, serve_in_thread
from topology import CpuNode

TOKEN = "top-token"
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def _served():
    cpu = CpuManager(
        SimCpuBackend(),
        nodes={"n0": CpuNode.flat("n0", 2), "n1": CpuNode.flat("n1", 2)},
        memory_mb={"n0": 1024, "n1": 1024},
    )
    return serve_in_thread(create_app(Tangram(cpu=cpu), token=TOKEN))


def test_top_renders_a_live_servers_state():
    with _served() as url:
        h = {"authorization": f"Bearer {TOKEN}"}
        env = httpx.post(f"{url}/v1/envs", json={"trajectory": "t", "memory_mb": 64}, headers=h)
        env_id = env.json()["env_id"]
        for cmd in ("true", "true", "false"):
            httpx.post(f"{url}/v1/envs/{env_id}/exec", json={"command": cmd}, headers=h)
        console = Console(record=True, width=120)
        code = asyncio.run(top.run(url, TOKEN, 0.1, True, console))
        text = re.sub(r"[│┃]", " ", console.export_text())  # the table's rules out
    assert code == 0
    assert "queue 0" in text and "environments 1" in text and "cpu sim" in text
    assert re.search(r"cpu\s+all\s+0\s+4\s+0%", text), text
    assert re.search(r"n0\s+0\s+2", text) and re.search(r"n1\s+0\s+2", text), text
    assert re.search(r"exec\s+ok\s+3\b", text), text  # (sim: nothing runs, all three ok)


def test_the_dashboard_names_only_metrics_the_server_exports():
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\btangram_[a-z_]+", e)}
    with _served() as url:
        h = {"authorization": f"Bearer {TOKEN}"}
        env = httpx.post(f"{url}/v1/envs", json={"trajectory": "t", "memory_mb": 64}, headers=h)
        httpx.post(f"{url}/v1/envs/{env.json()['env_id']}/exec", json={"command": "true"},
                   headers=h)  # fmt: skip
        text = httpx.get(f"{url}/metrics", headers=h).text
    # every family the server declares (a labelled one before its first sample too) and
    # every sample's name (a histogram's _bucket, _sum, _count)
    exported = set(re.findall(r"^(?:# HELP )?(tangram_[a-z_]+)", text, re.M))
    assert named and named <= exported, named - exported
    assert len(doc["panels"]) >= 5 and all(p["targets"] for p in doc["panels"])
