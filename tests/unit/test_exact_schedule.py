"""Hand-worked exact schedules, the CLI, and the verifier catching broken schedules."""

import json

import pytest

from evaluation.solve import main as solve_main
from solvers.exact.model import instance_model, to_ticks
from solvers.exact.schedule import solve_schedule
from solvers.exact.timeline import verify
from tangram.errors import InvariantError
from tangram.instance import parse_instance
from tangram.pools import Placement
from tangram.results import ScheduledAction

BACKENDS = ["cpsat", "pulp-cbc", "pulp-highs"]
FLAT4 = {"cpu": {"topology": "flat", "units": 4}}
GPU2 = {"gpu": {"topology": "chunks", "nodes": 1, "gpus_per_node": 2}}


def fixed(aid, demand, duration, arrival=0.0):
    return {"id": aid, "arrival": arrival, "demand": demand, "duration": duration}


@pytest.mark.parametrize("backend", BACKENDS)
def test_shortest_first_on_a_full_flat_pool(backend):
    # both need all 4 units: short first gives 1 + 3 = 4, long first 2 + 3 = 5
    inst = parse_instance(
        {
            "resources": FLAT4,
            "actions": [fixed("long", {"cpu": 4}, 2.0), fixed("short", {"cpu": 4}, 1.0)],
        }
    )
    s = solve_schedule(inst, backend, time_limit=10)
    assert s.status == "optimal"
    assert s.total_act == pytest.approx(4.0)
    start = {e.action.id: e.start for e in s.entries}
    assert start == pytest.approx({"short": 0.0, "long": 1.0})


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_small_gpu_actions_share_a_node_before_the_big_one(backend):
    # 1-GPU b and c run side by side (1 + 1), then the 2-GPU a (1 + 2): 5; a first costs 8
    inst = parse_instance(
        {
            "resources": GPU2,
            "actions": [
                fixed("a", {"gpu": 2}, 2.0),
                fixed("b", {"gpu": 1}, 1.0),
                fixed("c", {"gpu": 1}, 1.0),
            ],
        }
    )
    s = solve_schedule(inst, backend, time_limit=10)
    assert s.total_act == pytest.approx(5.0)
    chunks = {e.action.id: e.placement["gpu"].chunk for e in s.entries}
    assert {chunks["b"], chunks["c"]} == {(0, 1), (1, 2)} and chunks["a"] == (0, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_elastic_action_takes_its_fastest_amount_and_waits_for_arrival(backend):
    inst = parse_instance(
        {
            "resources": FLAT4,
            "actions": [
                {
                    "id": "e",
                    "arrival": 3.0,
                    "key": "cpu",
                    "demand": {"cpu": [1, 2, 4]},
                    "t_ori": 8.0,
                    "efficiency": {"1": 1.0, "2": 1.0, "4": 0.4},
                }
            ],
        }
    )
    s = solve_schedule(inst, backend, time_limit=10)
    (e,) = s.entries
    assert e.units == {"cpu": 2} and e.start == pytest.approx(3.0)  # 8/(2*1)=4 beats 8/(4*.4)=5
    assert s.total_act == pytest.approx(4.0)


def test_rounding_reports_real_durations_and_closes_the_gaps():
    # 0.33 s rounds up to 4 ticks of 0.1 s; the reported schedule uses the real 0.33 s, and the
    # second action starts at 0.33 (left shift), not at the tick boundary 0.4
    inst = parse_instance(
        {
            "resources": FLAT4,
            "actions": [fixed("x", {"cpu": 4}, 0.33), fixed("y", {"cpu": 4}, 0.33)],
        }
    )
    s = solve_schedule(inst, "cpsat", time_limit=10, resolution=0.1)
    assert s.total_act == pytest.approx(0.33 + 0.66)
    assert sorted(e.start for e in s.entries) == pytest.approx([0.0, 0.33])
    assert to_ticks(0.2, 0.01) == 20 and to_ticks(0.201, 0.01) == 21


def test_verify_rejects_overlap_and_early_start():
    inst = parse_instance(
        {
            "resources": GPU2,
            "actions": [fixed("a", {"gpu": 2}, 2.0), fixed("b", {"gpu": 1}, 1.0, arrival=1.0)],
        }
    )
    model = instance_model(inst.build_pools(), inst.actions)
    a, b = inst.actions
    good = [
        ScheduledAction(
            a, a.submit_time, 0.0, 2.0, {"gpu": 2}, {"gpu": Placement("gpu0", chunk=(0, 2))}
        ),
        ScheduledAction(
            b, b.submit_time, 2.0, 3.0, {"gpu": 1}, {"gpu": Placement("gpu0", chunk=(1, 2))}
        ),
    ]
    verify(model.template, good, {"a": 0.0, "b": 1.0})
    overlap = [
        good[0],
        ScheduledAction(
            b, b.submit_time, 1.5, 2.5, {"gpu": 1}, {"gpu": Placement("gpu0", chunk=(1, 2))}
        ),
    ]
    with pytest.raises(InvariantError):
        verify(model.template, overlap)
    early = [
        good[0],
        ScheduledAction(b, b.submit_time, 0.5, 1.5, {"gpu": 1}, {"gpu": Placement("gpu0")}),
    ]
    with pytest.raises(InvariantError):
        verify(model.template, early, {"a": 0.0, "b": 1.0})


@pytest.mark.parametrize("backend", BACKENDS)
def test_solve_cli_prints_replay_json_with_status_and_bound(tmp_path, capsys, backend):
    path = tmp_path / "inst.json"
    path.write_text(
        json.dumps(
            {
                "resources": FLAT4,
                "actions": [
                    fixed("long", {"cpu": 4}, 2.0),
                    fixed("short", {"cpu": [2, 4]}, 1.0, arrival=0.5),
                ],
            }
        )
    )
    assert solve_main([str(path), "--backend", backend, "--time-limit", "10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "optimal"
    assert set(doc["actions"]) == {"long", "short"}
    assert set(doc["actions"]["short"]) >= {"start", "end", "units"}
    assert doc["total_act"] == pytest.approx(sum(a["end"] for a in doc["actions"].values()) - 0.5)
    assert doc["bound"] is None or doc["bound"] <= doc["total_act"] + 1e-6
