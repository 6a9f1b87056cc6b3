"""The hand-worked GPU scenarios replayed through the project's simulator and the heuristic
scheduler (what `tangram replay` runs): the same restores, and the same end times. The project's
own modules are imported plainly: an import regression fails here, never shows as a skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.simulator import simulate
from solvers import get_allocator
from tangram.instance import parse_instance

SCENARIOS = sorted((Path(__file__).parents[1] / "scenarios").glob("gpu_*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_replay_models_restores(path: Path) -> None:
    doc = json.loads(path.read_text())
    result = simulate(parse_instance(doc), get_allocator("heuristic"))
    got = {aid: r.restored for aid, r in result.records.items()}
    assert got == doc["expected"]["restored"]
    for aid, end in doc["expected"].get("end", {}).items():
        assert result.records[aid].end == pytest.approx(end), aid
