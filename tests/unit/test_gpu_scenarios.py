"""Hand-worked GPU residency scenarios (tests/scenarios/gpu_*.json) replayed through the pure
pool logic: the instance's services, a chunk pool with the residency preference, LRU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.gpu_trace import chunk_of, serve
from managers.gpu.sim import SimServiceModel
from tangram.instance import parse_instance

SCENARIOS = sorted((Path(__file__).parents[1] / "scenarios").glob("gpu_*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    doc = json.loads(path.read_text())
    inst = parse_instance(doc)
    spec = inst.resources["gpu"]
    model = SimServiceModel(spec)
    served = {s.action_id: s for s in serve(inst.actions, spec.build_pool(), model.residency)}
    expected = doc["expected"]
    assert {a: s.restored for a, s in served.items()} == expected["restored"]
    for a, victims in expected.get("evicted", {}).items():
        assert list(served[a].evicted) == victims, a
    for a, chunk in expected.get("chunk", {}).items():
        assert list(chunk_of(served[a].placement["gpu"])) == chunk, a
    for a, end in expected.get("end", {}).items():
        assert served[a].end == pytest.approx(end), a


def test_scenarios_exist() -> None:
    assert len(SCENARIOS) >= 4
