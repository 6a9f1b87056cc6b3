"""Replay every hand-worked scenario file through the CLI's code path and compare."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.simulator import simulate
from solvers import get_allocator
from tangram.instance import load_instance

SCEN = Path(__file__).parent / "scenarios"
# an expected entry named after a policy ("heuristic", "heuristic-depth1", "min"; or naming it
# in "policy") holds the replay answer; other entries belong to other tests (e.g. the GPU
# residency scenarios)
CASES = [
    (f, name)
    for f in sorted(SCEN.glob("*.json"))
    for name, exp in json.loads(f.read_text()).get("expected", {}).items()
    if isinstance(exp, dict) and "total_act" in exp
]


@pytest.mark.parametrize("path,name", CASES, ids=[f"{p.stem}:{n}" for p, n in CASES])
def test_scenario(path, name):
    exp = json.loads(path.read_text())["expected"][name]
    policy = exp.get("policy", name.split("-")[0])
    options = {k: exp[k] for k in ("depth", "allow_wait", "lookahead") if k in exp}
    result = simulate(load_instance(path), get_allocator(policy, **options)).to_json()
    assert result["total_act"] == pytest.approx(exp["total_act"])
    for aid, want in exp["actions"].items():
        got = result["actions"][aid]
        for k, v in want.items():
            assert got[k] == (pytest.approx(v) if isinstance(v, (int, float)) else v), (aid, k)


def test_replay_cli_json():
    path = SCEN / "elastic_sequential.json"
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "replay", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["total_act"] == pytest.approx(6.0)
    assert doc["actions"]["a"]["units"] == {"cpu": 4}


def test_replay_cli_bad_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "resources": {"cpu": {"topology": "flat", "units": 2}},
                "actions": [{"id": "x", "demand": {"gpu": [1]}, "duration": 1}],
            }
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "tangram.runtime.cli", "replay", str(bad)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "actions[x].demand.gpu" in out.stderr and "Traceback" not in out.stderr
