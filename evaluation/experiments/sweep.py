"""One-at-a-time sensitivity of the headline ratios to every parameter that carries a range.

A knob is a parameter with a range in its metadata (`evaluation.params`: every assumed one and
the sourced ones with a published band), a baseline parameter, or a size (batch and capacity
x0.75 and x1.25). Each knob is set to its low and its high end, the others stay at their
defaults, and the experiment's headline figures are measured again at the experiment's own
sizes. A figure's range is the lowest and highest value over the sweep, its default included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evaluation.baselines import ApiRetry, Kubernetes
from evaluation.baselines.batching import BatchingParams
from evaluation.experiments.common import RUNNING, Compare, Outcome, overriding
from evaluation.output import Steps
from evaluation.params import ASSUMED, sources
from evaluation.workloads.coding import CodingParams
from evaluation.workloads.gpu import MopdParams, SearchParams

TARGETS: dict[str, type] = {
    "coding": CodingParams,
    "search": SearchParams,
    "mopd": MopdParams,
    "k8s": Kubernetes,
    "api-retry": ApiRetry,
    "batching": BatchingParams,
}
SIZE_FACTORS = (0.75, 1.25)
SIZES = ("batch", "nodes", "seed")  # swept as sizes (size.batch, size.capacity), or not at all


@dataclass(frozen=True)
class Knob:
    target: str
    name: str
    default: Any
    lo: Any
    hi: Any
    kind: str  # assumed | sourced | size (batch; CPU capacity; GPU nodes)
    source: str

    @property
    def label(self) -> str:
        return f"{self.target}.{self.name}"


def knobs(targets: Sequence[str]) -> list[Knob]:
    sizes = (
        ["batch"]
        + (["capacity"] if "coding" in targets else [])
        + (["gpu_capacity"] if "mopd" in targets else [])
    )
    out = [
        Knob(
            "size",
            s,
            1.0,
            SIZE_FACTORS[0],
            SIZE_FACTORS[1],
            "size",
            "full-size choice: x0.75 and x1.25",
        )
        for s in sizes
    ]
    for t in targets:
        for p in sources(TARGETS[t]()):
            if p.range is None or p.name in SIZES:
                continue
            out.append(Knob(t, p.name, p.value, p.range[0], p.range[1], p.kind, p.source))
    return out


def points(ks: Sequence[Knob]) -> Iterator[tuple[Knob, Any]]:
    for k in ks:
        for v in (k.lo, k.hi):
            if v != k.default:
                yield k, v


Measure = Callable[[], Mapping[str, float | None]]


def sweep(
    measure: Measure, targets: Sequence[str]
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """(the figures at the defaults, one entry per knob end with the figures there)."""
    base = dict(measure())
    effects = []
    todo = list(points(knobs(targets)))
    with Steps(len(todo), f"{RUNNING.get()}: sweep") as steps:
        for k, v in todo:
            steps.describe(f"{k.label}={v}")
            with overriding({k.target: {k.name: v}}):
                got = dict(measure())
            steps.advance(f"{k.label}={_js(v)}")
            effects.append(
                {
                    "knob": k.label,
                    "kind": k.kind,
                    "default": _js(k.default),
                    "value": _js(v),
                    "range": [_js(k.lo), _js(k.hi)],
                    "source": k.source,
                    "figures": got,
                }
            )
    return base, effects


def _js(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def attach_ranges(outcome: Outcome, measure: Measure, targets: Sequence[str]) -> Outcome:
    """Give every compare row with a paper value the range of ours over the sweep."""
    base, effects = sweep(measure, targets)
    rows = []
    for c in outcome.compares:
        if c.paper is not None and c.ours is not None:
            vals = [c.ours] + [v for e in effects if (v := e["figures"].get(c.metric)) is not None]
            c = dataclasses.replace(c, range=(min(vals), max(vals)))
        rows.append(c)
    outcome.compares = rows
    outcome.sensitivity = effects
    if any(base.get(c.metric) not in (None, c.ours) for c in rows if c.paper is not None):
        outcome.notes.append(
            "a headline measured twice differed: the sweep's default point is "
            "not the experiment's own run"
        )
    return outcome


def headline(outcome_compares: list[Compare]) -> dict[str, float | None]:
    """The figures of the rows that have a paper value."""
    return {c.metric: c.ours for c in outcome_compares if c.paper is not None}


def assumed_knobs(targets: Sequence[str]) -> list[Knob]:
    return [k for k in knobs(targets) if k.kind == ASSUMED]
