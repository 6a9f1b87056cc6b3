"""Two worker processes, each with the verl adapter configured as `tangram: {url, token}`,
share one server's scheduler: no core is ever granted to two actions at once and never more
cores than the cluster has, asserted from the server's grants (each result's placement) and
the cores each command really ran on.

Were each process its own scheduler (the adapter's in-process Tangram), both would grant every
core of this machine at the same time and the overlap check below would fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from itertools import combinations

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.affinity import AffinityBackend
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app, serve_in_thread

pytestmark = pytest.mark.skipif(
    AffinityBackend.probe() is not None, reason=f"affinity backend: {AffinityBackend.probe()}"
)
TOKEN = "shared"
PER_WORKER = 3  # concurrent tool calls of each worker process

# One verl agent-loop worker: PER_WORKER trajectories at once, each one tool call that reports
# when it ran (wall clock, inside the command) and on which cores. verl itself is kept out
# (`sys.modules`): importing it costs seconds and the adapter's interface is the same.
WORKER = r"""
import asyncio, json, sys
sys.modules["verl"] = None
from tangram.adapters.verl import TangramTool, close_shared

url, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
COMMAND = ('python3 -c "import json, os, time; t = time.time(); time.sleep(0.4); '
           'print(json.dumps([t, time.time(), sorted(os.sched_getaffinity(0))]))"')
schema = {"type": "function", "function": {"name": "bash", "parameters": {}}}
tool = TangramTool({"tangram": {"url": url, "token": token}, "cpu": 1, "memory_mb": 16}, schema)

async def one(i):
    iid, _ = await tool.create()
    resp, _, metrics = await tool.execute(iid, {"command": COMMAND})
    await tool.release(iid)
    start, end, affinity = json.loads(resp.text.splitlines()[-1])
    return {"start": start, "end": end, "affinity": affinity, "cores": metrics["core_ids"]}

async def main():
    return await asyncio.gather(*(one(i) for i in range(n)))

records = asyncio.run(main())
close_shared()
print(json.dumps(records))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Tangram]]:
    workdir = tempfile.mkdtemp(prefix="tangram-shared-test-")
    tg = Tangram(cpu=CpuManager(AffinityBackend(), workdir_root=workdir))
    with serve_in_thread(create_app(tg, TOKEN)) as url:
        yield url, tg


def test_two_workers_never_overgrant(server):
    url, tg = server
    capacity = tg.status().pools["cpu"].capacity
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, TOKEN, str(PER_WORKER)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    records = []
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err[-2000:]
        records += json.loads(out.strip().splitlines()[-1])
    assert len(records) == 2 * PER_WORKER
    for r in records:  # each command ran on exactly the cores the server granted it
        assert r["affinity"] == sorted(r["cores"]) and len(r["cores"]) == 1
    for a, b in combinations(records, 2):  # no core held by two actions at once
        if a["start"] < b["end"] and b["start"] < a["end"]:
            assert not set(a["cores"]) & set(b["cores"]), (a, b)
    for r in records:  # never more cores in use than the cluster has
        held = sum(len(o["cores"]) for o in records if o["start"] <= r["start"] < o["end"])
        assert held <= capacity
    assert tg.status().envs == 0 and tg.status().pools["cpu"].free == capacity
