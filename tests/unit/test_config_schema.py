"""Config documents are checked one way (`tangram.runtime.config_schema`): every bad leaf is a
`ValidationError` naming its key path, whatever the leaf and whatever is wrong with it."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import tangram.runtime.config as config
from tangram.errors import ValidationError
from tangram.runtime.config import build, build_cpu
from tangram.runtime.config_schema import ConfigSpec, parse

GOOD = {
    "policy": {"name": "heuristic"},
    "idle_env_s": 600,
    "cpu": {"backend": "sim", "options": {}, "disk_mb": 512},
    "gpu": {
        "backend": "sim",
        "nodes": 2,
        "gpus_per_node": 4,
        "memory_gb": 80,
        "services": {
            "judge": {
                "memory_gb": 16,
                "dops": [1, 2],
                "infer_s": {1: 0.4, 2: 0.25},
                "restore_s": 0.5,
            }
        },
    },
    "apis": {
        "search": {
            "url": "http://127.0.0.1:9/s",
            "concurrency": 4,
            "quota": 20,
            "period_s": 1.0,
            "timeout_s": 10,
            "retries": 2,
            "learn": True,
        }
    },
}

# (path, wrong values for it): positive numbers, counts, flags, strings, mappings
NUMBERS = [0, -1, True, "1", float("inf"), float("nan"), None]
LEAVES = {
    ("idle_env_s",): [0, -3, True, "600", float("inf")],
    ("cpu", "backend"): [3, True, ["sim"]],
    ("cpu", "disk_mb"): [0, -1, 1.5, True, "512"],
    ("cpu", "options"): [3, "x", [1]],
    ("gpu", "nodes"): [0, -1, 1.5, True, "2"],
    ("gpu", "gpus_per_node"): [0, 3, 6, True, 2.0],
    ("gpu", "memory_gb"): NUMBERS,
    ("gpu", "services", "judge", "memory_gb"): NUMBERS,
    ("gpu", "services", "judge", "restore_s"): [-1, True, "0.5", float("nan")],
    ("gpu", "services", "judge", "dops"): [[], 2, "1,2", [0], [1.5]],
    ("gpu", "services", "judge", "infer_s"): [{3: 0.1}, {1: 0}, {1: True}, [0.4]],
    ("apis", "search", "url"): [None, 3, ["u"]],
    ("apis", "search", "concurrency"): [0, -2, 1.5, True, "4"],
    ("apis", "search", "retries"): [-1, 1.5, True],
    ("apis", "search", "learn"): [1, "yes", None],
    ("apis", "search", "timeout_s"): NUMBERS,
}


def _set(doc: dict, path: tuple[str, ...], value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def test_the_good_document_parses():
    spec = parse(ConfigSpec, "", GOOD)
    assert spec.gpu.services["judge"].infer_s == {1: 0.4, 2: 0.25}
    assert spec.gpu.given("nodes") and not spec.gpu.given("options")


@settings(max_examples=120)
@given(data=st.data())
def test_every_bad_leaf_is_named_by_its_path(data):
    path = data.draw(st.sampled_from(sorted(LEAVES)))
    value = data.draw(st.sampled_from(LEAVES[path]))
    with pytest.raises(ValidationError) as e:
        parse(ConfigSpec, "", _set(GOOD, path, value))
    # the field is the leaf's path (or an element or key under it)
    assert e.value.field == ".".join(path) or e.value.field.startswith(".".join(path) + ".")
    assert e.value.problem and "Input should" not in e.value.problem


@settings(max_examples=60)
@given(
    where=st.sampled_from(
        [(), ("cpu",), ("gpu",), ("gpu", "services", "judge"), ("apis", "search")]
    ),
    key=st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
)
def test_an_unknown_key_is_named_with_the_keys_allowed_there(where, key):
    node = GOOD
    for k in where:
        node = node[k]
    if key in node or key in {
        "policy",
        "url",
        "method",
        "headers",
        "quota",
        "period_s",
        "backoff_s",
        "model",
        "options",
        "state_dir",
        "disk_capacity_mb",
        "backend",
        "services",
        "apis",
        "gpu",
        "cpu",
        "idle_env_s",
    }:
        return  # a real key: not unknown
    doc = _set(GOOD, (*where, key), 1)
    with pytest.raises(ValidationError) as e:
        parse(ConfigSpec, "", doc)
    assert e.value.field == ".".join((*where, key))
    assert e.value.problem.startswith("unknown key (allowed: [")


def test_an_option_the_backend_does_not_take_is_named_not_a_type_error():
    with pytest.raises(ValidationError) as e:
        build({"cpu": {"backend": "sim", "options": {"time_scal": 1.0}}, "gpu": None})
    assert e.value.field == "cpu.options.time_scal"
    assert "time_scale" in e.value.problem  # says what the backend does take


def test_cpu_false_means_no_cpu_pool_and_a_bad_policy_names_its_option():
    assert build({"cpu": False}).cpu is None
    with pytest.raises(ValidationError, match=r"^policy\.deep"):
        build({"cpu": False, "policy": {"name": "heuristic", "deep": 2}})
    with pytest.raises(ValidationError, match=r"^policy: must be a policy name"):
        build({"cpu": False, "policy": 3})
    with pytest.raises(ValidationError, match=r"^config: must be a mapping"):
        build([1, 2])  # type: ignore[arg-type]


def test_the_documented_example_parses():
    """The YAML in `tangram.runtime.config`'s docstring is a valid document."""
    text = config.__doc__.split("```yaml", 1)[1].split("```", 1)[0]
    spec = parse(ConfigSpec, "", yaml.safe_load(text))
    assert spec.gpu.services["judge"].dops == [1, 2] and spec.apis["search"].quota == 20


def test_the_background_allowance_is_a_config_key_checked_at_load():
    assert build_cpu("cpu", {"backend": "sim", "background": 0.25}).background == 0.25
    assert build_cpu("cpu", {"backend": "sim"}).background == 0.1
    for bad in (0, 2, "x", True):
        with pytest.raises(ValidationError) as got:
            build_cpu("cpu", {"backend": "sim", "background": bad})
        assert got.value.field == "cpu.background"
