import json

import pytest

from tangram import Infeasible, TangramError, ValidationError
from tangram.instance import load_instance, parse_instance

CPU = {"cpu": {"topology": "flat", "units": 4}}


def doc(*actions, resources=CPU):
    return {"resources": resources, "actions": list(actions)}


@pytest.mark.parametrize(
    "action,field",
    [
        ({"id": "a", "demand": {"gpu": [1]}, "duration": 1}, "actions[a].demand.gpu"),
        (
            {
                "id": "a",
                "demand": {"cpu": [1, 2]},
                "key": "cpu",
                "t_ori": 2,
                "efficiency": {"1": 1.0},
            },
            "actions[a].efficiency.2",
        ),
        (
            {"id": "a", "demand": {"cpu": [1]}, "key": "cpu", "t_ori": 2, "efficiency": {"1": 1.5}},
            "actions[a].efficiency[1]",
        ),
        ({"id": "a", "demand": {"cpu": [1]}, "duration": -1}, "actions[a].duration"),
        ({"id": "a", "demand": {"cpu": [1]}}, "actions[a].duration"),
        ({"id": "a", "demand": {"cpu": [0]}, "duration": 1}, "actions[a].demand.cpu"),
        ({"id": "a", "demand": {"cpu": [1]}, "duration": 1, "colour": "red"}, "actions[0].colour"),
        (
            {"id": "a", "demand": {"cpu": [1]}, "duration": 1, "arrival": "soon"},
            "actions[a].arrival",
        ),
    ],
)
def test_bad_actions_name_the_field(action, field):
    with pytest.raises(ValidationError) as exc:
        parse_instance(doc(action))
    assert exc.value.field == field


def test_never_fits_is_infeasible():
    with pytest.raises(Infeasible, match="can never fit"):
        parse_instance(doc({"id": "a", "demand": {"cpu": [5, 6]}, "duration": 1}))


def test_gpu_amounts_must_be_powers_of_two():
    res = {"gpu": {"topology": "chunks", "nodes": 1, "gpus_per_node": 8}}
    with pytest.raises(ValidationError, match="powers of two"):
        parse_instance(doc({"id": "a", "demand": {"gpu": [3]}, "duration": 1}, resources=res))


def test_bad_resources():
    with pytest.raises(ValidationError, match="topology"):
        parse_instance(doc(resources={"cpu": {"topology": "mesh", "units": 1}}))
    with pytest.raises(ValidationError, match="gpus_per_node"):
        parse_instance(doc(resources={"g": {"topology": "chunks", "nodes": 1, "gpus_per_node": 6}}))
    with pytest.raises(ValidationError, match="duplicate"):
        a = {"id": "a", "demand": {"cpu": [1]}, "duration": 1}
        parse_instance(doc(a, a))


def test_load_errors(tmp_path):
    with pytest.raises(TangramError, match="not found"):
        load_instance(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(TangramError, match="not valid JSON"):
        load_instance(tmp_path / "x.json")
    (tmp_path / "ok.json").write_text(
        json.dumps(doc({"id": "a", "demand": {"cpu": 2}, "duration": 1}))
    )
    assert load_instance(tmp_path / "ok.json").actions[0].mins == {"cpu": 2}


GPUS = {
    "gpu": {
        "topology": "chunks",
        "nodes": 1,
        "gpus_per_node": 4,
        "memory_gb": 40,
        "services": {"big": {"memory_gb": 10, "restore_s": 1, "weights_gb": 60}},
    },
    "npu": {"topology": "chunks", "nodes": 1, "gpus_per_node": 2},
}


def test_a_service_asked_at_a_size_its_copy_does_not_fit_names_the_amount():
    """60 GB of weights over 1 GPU is 70 GB a GPU of 40: only the 2- and 4-GPU copies fit."""
    a = {"id": "a", "demand": {"gpu": [1, 4]}, "service": "big", "duration": 1}
    with pytest.raises(ValidationError, match="a 1-GPU copy of big needs 70 GB") as exc:
        parse_instance(doc(a, resources=GPUS))
    assert exc.value.field == "actions[a].demand.gpu" and exc.value.value == 1
    parse_instance(doc({**a, "demand": {"gpu": [2, 4]}}, resources=GPUS))


def test_a_service_runs_on_one_gpu_pool():
    a = {"id": "a", "demand": {"gpu": 4, "npu": 1}, "service": "big", "duration": 1}
    with pytest.raises(ValidationError, match="demands 2 \\(gpu, npu\\)") as exc:
        parse_instance(doc(a, resources=GPUS))
    assert exc.value.field == "actions[a].service"


def test_an_action_of_a_bound_trajectory_must_fit_its_node():
    """b names no node, but its trajectory is bound to n0 (1 unit) by a: it could never run."""
    res = {"cpu": {"topology": "flat", "nodes": {"n0": 1, "n1": 4}}}
    a = {"id": "a", "trajectory": "t", "node": "n0", "demand": {"cpu": 1}, "duration": 1}
    b = {"id": "b", "trajectory": "t", "demand": {"cpu": [3, 4]}, "duration": 1}
    with pytest.raises(Infeasible, match=r"actions\[b\]\.demand\.cpu: needs at least 3.*n0"):
        parse_instance(doc(b, a, resources=res))
    parse_instance(doc({**b, "demand": {"cpu": 1}}, a, resources=res))
