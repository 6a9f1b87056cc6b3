"""Where every workload and baseline parameter comes from, in its dataclass field's metadata.

Three kinds, and nothing else passes `check_sources`:

- `src(text)`: a published figure (docs/sensitivity.md lists them); `src(text, lo, hi)` adds the
  published band, and the sensitivity sweep then varies the parameter over it.
- `assumed(why, lo, hi)`: no published figure; the plausible range is swept.
- `setting(why)`: a choice of the experiment that is not a model of the world (a seed).

Sizes (batch, capacity, pod size) are swept separately by `evaluation.experiments.sweep`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SOURCED, ASSUMED, SETTING = "sourced", "assumed", "setting"


def src(text: str, lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
    """A published figure, optionally with its published band [lo, hi]."""
    band = None if lo is None or hi is None else (lo, hi)
    return {"kind": SOURCED, "source": text, "range": band}


def assumed(why: str, lo: float, hi: float) -> dict[str, Any]:
    """No published figure: a plausible range [lo, hi] that the sensitivity sweep covers."""
    return {"kind": ASSUMED, "source": f"assumed: {why}", "range": (lo, hi)}


def setting(why: str) -> dict[str, Any]:
    return {"kind": SETTING, "source": f"setting: {why}", "range": None}


@dataclass(frozen=True)
class ParamInfo:
    name: str
    value: Any
    kind: str  # sourced | assumed | setting | "" (undeclared)
    source: str
    range: tuple[float, float] | None


def sources(params: Any) -> list[ParamInfo]:
    """Every field of a parameter dataclass with where its value comes from."""
    out = []
    for f in dataclasses.fields(params):
        if not f.init or f.name.startswith("_"):
            continue
        md = f.metadata
        out.append(
            ParamInfo(
                f.name,
                getattr(params, f.name),
                md.get("kind", ""),
                md.get("source", ""),
                md.get("range"),
            )
        )
    return out


def check_sources(params: Any) -> list[str]:
    """What is wrong with the parameters' provenance: an empty list when every field is either
    sourced, assumed with a range holding its value, or a setting."""
    problems = []
    for p in sources(params):
        where = f"{type(params).__name__}.{p.name}"
        if p.kind not in (SOURCED, ASSUMED, SETTING):
            problems.append(f"{where}: neither a source nor an assumed range")
        elif not p.source.strip() or p.source.strip().endswith(":"):
            problems.append(f"{where}: empty source text")
        elif p.kind == ASSUMED and p.range is None:
            problems.append(f"{where}: assumed without a range")
        if p.range is not None and isinstance(p.value, (int, float)):
            lo, hi = p.range
            if not lo <= p.value <= hi:
                problems.append(f"{where}: value {p.value} outside its range [{lo}, {hi}]")
    return problems
