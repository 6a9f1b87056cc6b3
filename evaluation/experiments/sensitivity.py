"""`tangram experiment sensitivity [--quick] [--json]`: every parameter with a range (each
assumed one, each sourced one with a published band, the baselines' and the sizes) set to
each end of its range, one at a time, and the effect on every headline ratio that has a paper
value.

`--quick` runs each experiment's quick sizes scaled by 0.25 in batch and CPU capacity (CI, about
two minutes on 2 cores); without it, the experiments' full sizes (hours).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import time
from pathlib import Path
from typing import Any

from evaluation.experiments.common import oracle_estimates, overriding
from evaluation.experiments.sweep import TARGETS, knobs, sweep
from evaluation.params import sources

MODULES = {
    "fig6": "evaluation.experiments.fig6",
    "fig7": "evaluation.experiments.fig7",
    "fig8-cpu": "evaluation.experiments.fig8cpu",
    "fig8-gpu": "evaluation.experiments.fig8gpu",
    "fig9": "evaluation.experiments.fig9",
    "table1": "evaluation.experiments.table1",
}
QUICK_SCALE = {"size": {"batch": 0.25, "capacity": 0.25}}


def paper_values() -> dict[str, float]:
    """metric prefix -> the paper's value, as the experiments' `Compare` rows give it
    (`tests/integration/test_sensitivity.py` checks that both agree)."""
    return {
        "coding: ACT (queue + run per action)": 4.3,
        "coding: rollout makespan": 1.4,
        "deepsearch: rollout makespan": 1.5,
        "coding: environment": 9.0,
        "coding: reward": 2.8,
        "coding: total": 4.3,
        "ACT vs Kubernetes, smallest": 3.1,
        "ACT vs Kubernetes, largest": 27.7,
        "GPUs Tangram needs": 29.0,
        "static / Tangram mean ACT, batch 2048": 18.1,
        "fixed DoP=16": 3.0,
        "AI coding: overhead,": 3.0,
        "MOPD: restore overhead": 25.0,
    }


def _paper(metric: str) -> float | None:
    return next((v for k, v in paper_values().items() if metric.startswith(k)), None)


def run(quick: bool, names: list[str] | None = None) -> dict[str, Any]:
    exps = []
    for name in names or list(MODULES):
        mod = importlib.import_module(MODULES[name])
        t0 = time.perf_counter()
        with overriding(QUICK_SCALE if quick else {}):
            base, effects = sweep(lambda m=mod: m.measure(quick), mod.TARGETS)
        compares = []
        for metric, ours in base.items():
            vals = [ours] + [e["figures"].get(metric) for e in effects]
            vals = [v for v in vals if v is not None]
            compares.append(
                {
                    "metric": metric,
                    "ours": ours,
                    "paper": _paper(metric),
                    "range": [min(vals), max(vals)] if ours is not None else None,
                }
            )
        exps.append(
            {
                "experiment": name,
                "wall_s": round(time.perf_counter() - t0, 1),
                "compare": compares,
                "sensitivity": effects,
            }
        )
    return {
        "quick": quick,
        "experiments": exps,
        "parameters": parameters(),
        "decisive": decisive(exps),
    }


def parameters() -> list[dict[str, Any]]:
    seen, out = set(), []
    for k in knobs(tuple(TARGETS)):
        if k.label not in seen:
            seen.add(k.label)
            out.append(
                {
                    "parameter": k.label,
                    "kind": k.kind,
                    "default": _js(k.default),
                    "range": [_js(k.lo), _js(k.hi)],
                    "source": k.source,
                }
            )
    return out


def _js(v):
    return list(v) if isinstance(v, tuple) else v


def parameters_markdown() -> str:
    """Every parameter of the workloads and baselines: value, kind, range, source."""
    lines = ["| parameter | default | kind | range swept | source |", "|---|---|---|---|---|"]
    for target, cls in TARGETS.items():
        for p in sources(cls()):
            rng = "-" if p.range is None else f"{_fmt(p.range[0])} - {_fmt(p.range[1])}"
            src = p.source.replace("|", "/")
            lines.append(f"| `{target}.{p.name}` | {_fmt(p.value)} | {p.kind} | {rng} | {src} |")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, tuple):
        return "{" + ",".join(map(str, v)) + "}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def decisive(exps) -> list[dict[str, Any]]:
    """Per knob, its largest effect on any headline: max |log(value / default value)|."""
    worst: dict[str, tuple[float, str, Any, float, float]] = {}
    for e in exps:
        base = {c["metric"]: c["ours"] for c in e["compare"]}
        for s in e["sensitivity"]:
            for m, v in s["figures"].items():
                b = base.get(m)
                if v is None or b is None or v <= 0 or b <= 0:
                    continue
                eff = abs(math.log(v / b))
                if eff > worst.get(s["knob"], (-1.0,))[0]:
                    worst[s["knob"]] = (eff, m, s["value"], b, v)
    rows = [
        {
            "knob": k,
            "effect": round(math.exp(w[0]), 3),
            "metric": w[1],
            "at": w[2],
            "default_value": round(w[3], 3),
            "value": round(w[4], 3),
        }
        for k, w in worst.items()
    ]
    return sorted(rows, key=lambda r: -r["effect"])


def print_report(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(
        title="headline ratios over the one-at-a-time sweep"
        + (" (quick: sizes x0.25)" if doc["quick"] else "")
    )
    for c in ("experiment", "figure", "ours", "range", "paper"):
        t.add_column(c)
    for e in doc["experiments"]:
        for c in e["compare"]:
            f = lambda v: "-" if v is None else f"{v:.2f}"
            rng = "-" if c["range"] is None else f"{c['range'][0]:.2f}-{c['range'][1]:.2f}"
            t.add_row(e["experiment"], c["metric"], f(c["ours"]), rng, f(c["paper"]))
    con.print(t)
    t = Table(title="largest effect of each knob on any headline (x = value / default value)")
    for c in ("knob", "effect", "figure", "at", "default", "there"):
        t.add_column(c)
    for r in doc["decisive"]:
        t.add_row(
            r["knob"],
            f"{r['effect']:.2f}x",
            r["metric"],
            str(r["at"]),
            f"{r['default_value']:.2f}",
            f"{r['value']:.2f}",
        )
    con.print(t)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram experiment sensitivity", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--oracle", action="store_true")
    p.add_argument("--out", default="results")
    p.add_argument("--only", nargs="*", choices=list(MODULES), help="these experiments only")
    p.add_argument(
        "--params-md", action="store_true", help="print the parameter table (markdown) and exit"
    )
    ns = p.parse_args(argv)
    if ns.params_md:
        print(parameters_markdown())
        return 0
    with oracle_estimates(ns.oracle):
        doc = run(ns.quick, ns.only)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sensitivity.json").write_text(json.dumps(doc, indent=2))
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        print_report(doc)
    return 0
