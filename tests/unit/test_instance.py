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
