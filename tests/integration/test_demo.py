"""`tangram demo`, the README's main job, end to end at a small size: both runs complete with
real shell actions, search calls and pytest rewards, and nothing fails; `--trace` writes
Tangram's run as a trace Perfetto opens (every event well-formed, no unit holding two slices)
that `python -m evaluation.timeline` draws."""

import json
import subprocess
import sys

from evaluation import timeline
from tangram.trace import TRAJECTORIES, check_trace


def test_demo_runs_both_allocations(tmp_path):
    trace = tmp_path / "demo.json"
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "demo", "--trajectories", "2", "--json",
         "--trace", str(trace)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["run"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}
    assert set(rows) == {"tangram", "static"}
    for r in rows.values():
        assert r["failures"] == 0 and r["rewards_passed"] == 2
        assert r["mean_act_s"] > 0 and r["step_time_s"] > 0
    doc = json.loads(trace.read_text())
    assert check_trace(doc) == []
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert TRAJECTORIES in procs and any(p.startswith("cpu@") for p in procs), procs
    assert any(p.startswith("api:") for p in procs) and any(p.startswith("gpu@") for p in procs)
    png = timeline.draw(doc, tmp_path / "t.png", "demo")
    assert png.stat().st_size > 10_000
