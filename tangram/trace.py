"""Traces of a schedule in Chrome's trace-event format, which Perfetto (ui.perfetto.dev) and
`chrome://tracing` open: what held which unit when, and what each trajectory waited for.

One record per action (`tangram.results.ScheduledAction`, the record the runtime, the
simulator's engine and the exact solvers share) becomes:

- on each unit it held, a slice from its start to its end: a process per pool and node
  (`cpu@node-0`), a thread per core (`core 3`) or GPU (`gpu 2`); a flat pool (API slots, a
  pool with no placement) gets one thread per concurrently held slot, assigned first-free so
  no two slices of a thread overlap;
- on its trajectory (a process `trajectories`, a thread per trajectory), a `queued` slice from
  its arrival to its start, then its run, its status and units in the slice's `args`.

Times are microseconds from the first arrival. `chrome_trace` builds the document,
`write_trace` writes it (JSON); `check_trace` is what a test asks of one.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tangram.results import ScheduledAction

TRAJECTORIES = "trajectories"


def chrome_trace(records: Iterable[ScheduledAction]) -> dict[str, Any]:
    """The trace document of `records` (see the module docstring)."""
    rows = sorted(records, key=lambda r: (r.start, r.action_id))
    t0 = min((r.arrival for r in rows), default=0.0)
    names: dict[str, int] = {}  # process name -> pid
    threads: dict[tuple[int, str], int] = {}  # (pid, thread name) -> tid
    events: list[dict[str, Any]] = []
    flat: dict[str, list[tuple[float, int]]] = {}  # flat pool -> heap of (free at, slot)

    def track(process: str, thread: str) -> tuple[int, int]:
        pid = names.setdefault(process, len(names) + 1)
        key = (pid, thread)
        if key not in threads:
            threads[key] = sum(1 for p, _ in threads if p == pid) + 1
            meta = {"pid": pid, "tid": threads[key], "ph": "M"}
            events.append({**meta, "name": "thread_name", "args": {"name": thread}})
        return pid, threads[key]

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    for r in rows:
        args = {
            "action": r.action_id,
            "kind": r.action.kind,
            "units": dict(r.units),
            "status": str(r.status.value),
            "queued_ms": round((r.start - r.arrival) * 1e3, 3),
        }
        label = r.action.kind
        for resource, units in r.units.items():
            for process, thread in _units_held(r, resource, units, flat):
                pid, tid = track(process, thread)
                slice_ = {"name": label, "ph": "X", "pid": pid, "tid": tid}
                events.append({**slice_, "ts": us(r.start), "dur": us(r.end) - us(r.start),
                               "args": args})  # fmt: skip
        who = r.action.trajectory or r.action_id
        pid, tid = track(TRAJECTORIES, who)
        if r.start > r.arrival:
            events.append({"name": "queued", "ph": "X", "pid": pid, "tid": tid,
                           "ts": us(r.arrival), "dur": us(r.start) - us(r.arrival),
                           "args": args})  # fmt: skip
        events.append({"name": label, "ph": "X", "pid": pid, "tid": tid, "ts": us(r.start),
                       "dur": us(r.end) - us(r.start), "args": args})  # fmt: skip
    for process, pid in names.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _units_held(
    r: ScheduledAction, resource: str, units: int, flat: dict[str, list[tuple[float, int]]]
) -> list[tuple[str, str]]:
    """(process, thread) of each unit `r` held of `resource`."""
    placement = r.placement.get(resource)
    if placement is not None and placement.cores:
        return [(f"{resource}@{placement.node}", f"core {c}") for c in placement.cores]
    if placement is not None and placement.chunk is not None:
        lo, hi = placement.chunk
        return [(f"{resource}@{placement.node}", f"gpu {g}") for g in range(lo, hi)]
    pool = resource if placement is None else f"{resource}@{placement.node}"
    free = flat.setdefault(pool, [])
    slots = []
    while free and free[0][0] <= r.start and len(slots) < units:
        slots.append(heapq.heappop(free)[1])
    used = len(slots) + len(free)
    slots += range(used, used + units - len(slots))  # new slots where none was free
    for s in slots:
        heapq.heappush(free, (r.end, s))
    return [(pool, f"slot {s}") for s in sorted(slots)]


def write_trace(records: Iterable[ScheduledAction], path: str | Path) -> Path:
    """Write the trace of `records` to `path` (JSON); returns it."""
    out = Path(path)
    out.write_text(json.dumps(chrome_trace(records)))
    return out


def check_trace(doc: dict[str, Any]) -> list[str]:
    """What is wrong with a trace document (empty: nothing): every event has the fields its
    phase needs, durations are not negative, and no two slices of one unit's thread overlap
    (a core holds one action at a time)."""
    problems = []
    spans: dict[tuple[int, int], list[tuple[float, float]]] = {}
    named = {e["pid"] for e in doc.get("traceEvents", []) if e.get("name") == "process_name"}
    for e in doc.get("traceEvents", []):
        if e.get("ph") not in ("X", "M") or not isinstance(e.get("pid"), int):
            problems.append(f"bad event {e}")
            continue
        if e["ph"] == "X":
            if (
                not isinstance(e.get("name"), str)
                or not isinstance(e.get("tid"), int)
                or not e.get("dur", -1) >= 0
                or not e.get("ts", -1) >= 0
            ):
                problems.append(f"bad slice {e}")
                continue
            if e["pid"] not in named:
                problems.append(f"slice on an unnamed process {e}")
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    units = {e["pid"] for e in doc.get("traceEvents", []) if e.get("name") == "process_name"
             and e["args"]["name"] != TRAJECTORIES}  # fmt: skip
    for (pid, tid), xs in spans.items():
        if pid not in units:
            continue
        xs.sort()
        for (_, a1), (b0, _) in zip(xs, xs[1:]):
            if b0 < a1 - 1e-3:
                problems.append(f"pid {pid} tid {tid}: slices overlap at {b0} < {a1}")
    return problems
