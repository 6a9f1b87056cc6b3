"""`tangram experiment sensitivity --quick`: every assumed parameter is swept and every headline
ratio with a paper value carries a range holding ours."""

import json

from evaluation.experiments import WRITES, main, run_experiment
from evaluation.experiments.sensitivity import _paper
from evaluation.experiments.sweep import TARGETS, assumed_knobs
from evaluation.params import ASSUMED, sources


def test_sensitivity_quick_sweeps_every_assumed_parameter(tmp_path, capsys):
    assert main(["sensitivity", "--quick", "--json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    # what `tangram experiment --help` says it writes (WRITES), and nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"sensitivity.{s}" for s in WRITES["sensitivity"]
    ]
    rows = [c for e in doc["experiments"] for c in e["compare"] if c["paper"] is not None]
    assert len(rows) >= 12
    for c in rows:
        lo, hi = c["range"]
        assert lo <= c["ours"] <= hi, c
    swept = {s["knob"] for e in doc["experiments"] for s in e["sensitivity"]}
    listed = {p["parameter"]: p for p in doc["parameters"]}
    for target, cls in TARGETS.items():
        for p in sources(cls()):
            if p.kind == ASSUMED and p.name not in ("batch", "nodes"):  # sizes: size.*
                label = f"{target}.{p.name}"
                assert label in listed and listed[label]["range"] is not None, label
                assert label in swept, f"{label} is assumed but never swept"
    assert {k.label for k in assumed_knobs(tuple(TARGETS))} <= swept
    assert {"size.batch", "size.capacity", "k8s.pod_cores"} <= swept
    assert doc["decisive"][0]["effect"] >= doc["decisive"][-1]["effect"]


def test_sensitivity_paper_values_match_the_experiments():
    """The sweep's paper values are the experiments' own (fig6/fig7 quick, without the sweep)."""
    for name in ("fig6", "fig7"):
        for c in run_experiment(name, quick=True).compares:
            assert _paper(c.metric) == c.paper, c.metric
