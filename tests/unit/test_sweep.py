"""The sweep machinery: knobs from the parameters' metadata, overrides that reach the workload
and the baselines, ranges that hold ours."""

from pathlib import Path

from evaluation.experiments.common import (
    Compare,
    Outcome,
    kubernetes,
    overrides,
    overriding,
    workload,
)
from evaluation.experiments.sensitivity import parameters_markdown
from evaluation.experiments.sweep import attach_ranges, knobs
from evaluation.params import ASSUMED, sources
from evaluation.workloads.coding import CodingParams


def test_knobs_cover_every_assumed_and_banded_parameter():
    labels = {k.label for k in knobs(("coding", "k8s"))}
    for p in sources(CodingParams()):
        if p.range is not None and p.name not in ("batch", "nodes"):
            assert f"coding.{p.name}" in labels
    assert {"size.batch", "size.capacity", "k8s.pod_cores"} <= labels
    assert all(k.lo != k.hi for k in knobs(("coding",)))
    assert any(k.kind == ASSUMED for k in knobs(("coding",)))


def test_overrides_reach_workloads_and_baselines_and_size_factors_multiply():
    with overriding({"size": {"capacity": 0.75}}):
        with overriding({"size": {"capacity": 2.0, "batch": 0.5}, "k8s": {"pod_cores": 2}}):
            assert overrides("size") == {"capacity": 1.5, "batch": 0.5}
            w = workload("coding", batch=100, nodes=4, cores_per_node=16)
            assert (w.params.batch, w.params.nodes) == (50, 6)
            assert kubernetes().allocator.pod_cores == 2
        w = workload("coding", batch=100, nodes=4, cores_per_node=16)
        assert (w.params.batch, w.params.nodes) == (100, 3)
        with overriding({"coding": {"serial_fraction": 0.15}}):
            assert workload("coding", batch=2).params.serial_fraction == 0.15
    assert overrides("size") == {} and kubernetes().allocator.pod_cores == 4


def test_ranges_hold_ours_and_only_rows_with_a_paper_value_get_one():
    o = Outcome("x", [], [Compare("a", 2.0, 3.0), Compare("b", 1.0, None)], lambda r, f: None)

    def measure():
        return {"a": 1.0 + overrides("k8s").get("pod_cores", 4) / 4}  # 1.5 .. 3.0

    attach_ranges(o, measure, ("k8s",))
    a, b = o.compares
    assert a.range == (1.5, 3.0) and a.range[0] <= a.ours <= a.range[1]
    assert b.range is None
    assert {e["knob"] for e in o.sensitivity} >= {"k8s.pod_cores", "size.batch"}


def test_docs_list_every_parameter():
    text = (Path(__file__).parents[2] / "docs" / "sensitivity.md").read_text()
    for line in parameters_markdown().splitlines():
        assert line in text, f"docs/sensitivity.md is stale: {line}"
