"""`tangram demo`, the README's main job, end to end at a small size: both runs complete with
real shell actions, search calls and pytest rewards, and nothing fails."""

import json
import subprocess
import sys


def test_demo_runs_both_allocations():
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "demo", "--trajectories", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["run"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}
    assert set(rows) == {"tangram", "static"}
    for r in rows.values():
        assert r["failures"] == 0 and r["rewards_passed"] == 2
        assert r["mean_act_s"] > 0 and r["step_time_s"] > 0
