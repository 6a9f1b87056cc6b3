"""`python -m evaluation.timeline TRACE.json --out timeline.png`: a trace (`tangram.trace`:
`tangram demo --trace`, `tangram replay --trace`, `Tangram(trace=...)`) drawn as a timeline:
a row per core, GPU and API slot, each action a bar from its start to its end, coloured by
kind, so what held which unit when is seen at a glance (Perfetto shows the same file
interactively)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tangram.trace import TRAJECTORIES


def rows(doc: dict[str, Any]) -> dict[str, list[tuple[float, float, str]]]:
    """(start s, duration s, kind) of each slice, by unit ("cpu@local core 3"), units only."""
    process = {
        e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"
    }
    thread = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("name") == "thread_name"
    }
    out: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or process.get(e["pid"]) == TRAJECTORIES:
            continue
        unit = f"{process[e['pid']]} {thread[(e['pid'], e['tid'])]}"
        out[unit].append((e["ts"] / 1e6, e["dur"] / 1e6, str(e["name"])))
    return dict(sorted(out.items()))


def kind_of(name: str) -> str:
    """The colour key of a slice: its kind without the trajectory's own suffix."""
    return name.split(":")[0].split(" ")[0]


def draw(doc: dict[str, Any], out: Path, title: str) -> Path:
    units = rows(doc)
    kinds = sorted({kind_of(n) for xs in units.values() for _, _, n in xs})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(units) + 1.6))
    for y, xs in enumerate(units.values()):
        for start, dur, name in xs:
            ax.barh(y, dur, left=start, height=0.8, color=colours[kind_of(name)], linewidth=0)
    ax.set_yticks(range(len(units)), list(units), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first action arrived")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in kinds]
    below = -0.3 if len(units) < 8 else -0.12
    ax.legend(handles, kinds, loc="upper center", bbox_to_anchor=(0.5, below),
              ncol=min(6, len(kinds)), fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluation.timeline", description=__doc__)
    p.add_argument("trace", help="a trace JSON (tangram.trace)")
    p.add_argument("--out", default="timeline.png")
    p.add_argument("--title", default="what held which unit when")
    ns = p.parse_args(argv)
    draw(json.loads(Path(ns.trace).read_text()), Path(ns.out), ns.title)
    print(ns.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
