"""Traces (`tangram/trace.py`): the runtime's run (`Tangram(trace=...)`) and any schedule
become a Chrome trace-event document Perfetto opens: every event well-formed, every slice on a
named process, and no two slices of one core, GPU or API slot overlapping."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation import replay
from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.actions import Action
from tangram.pools import Placement
from tangram.resources import Demand
from tangram.results import ScheduledAction
from tangram.runtime.facade import Tangram
from tangram.trace import TRAJECTORIES, check_trace, chrome_trace
from topology import CpuNode


def test_a_runtime_run_writes_a_trace_perfetto_reads(tmp_path):
    path = tmp_path / "run.json"

    async def main():
        cpu = CpuManager(
            SimCpuBackend(duration=lambda c, n: 0.05, time_scale=1.0),
            nodes={"n0": CpuNode.flat("n0", 2)},
            memory_mb={"n0": 1024},
        )
        async with Tangram(cpu=cpu, trace=str(path)) as tg:
            envs = [await tg.open_env(f"t{i}", 64) for i in range(3)]
            await asyncio.gather(*(tg.exec(e, "work", cpu=1) for e in envs for _ in range(2)))

    asyncio.run(main())
    doc = json.loads(path.read_text())
    assert check_trace(doc) == []
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    procs = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert procs == {"cpu@n0", TRAJECTORIES}
    on_cores = [e for e in slices if e["name"] != "queued" and e["pid"] != _pid(doc, TRAJECTORIES)]
    assert len(on_cores) == 6  # six one-core actions, each on its core
    assert any(e["name"] == "queued" for e in slices)  # 6 actions on 2 cores: some waited


def _pid(doc, name):
    return next(
        (e["pid"] for e in doc["traceEvents"]
         if e.get("name") == "process_name" and e["args"]["name"] == name),
        None,
    )  # fmt: skip


@given(
    st.lists(
        st.tuples(
            st.floats(0, 10), st.floats(0, 5), st.floats(0.001, 3), st.integers(1, 3),
            st.sampled_from(["cores", "chunk", "flat"]),
        ),
        max_size=12,
    )
)  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_no_unit_holds_two_slices_at_once(rows):
    """Slices of one core, GPU or slot never overlap where the schedule itself never gives a
    unit twice: here each record takes fresh cores and chunks, and flat slots are assigned by
    the trace (first free)."""
    records = []
    for i, (arrival, wait, dur, k, how) in enumerate(rows):
        start = arrival + wait
        a = Action(f"a{i}", {"r": Demand.fixed(k)}, trajectory=f"t{i % 3}")
        placement = {
            "cores": {"r": Placement("n", cores=tuple(range(10 * i, 10 * i + k)))},
            "chunk": {"r": Placement("n", chunk=(8 * i, 8 * i + k))},
            "flat": {},
        }[how]
        records.append(ScheduledAction(a, arrival, start, start + dur, {"r": k}, placement))
    doc = chrome_trace(records)
    assert check_trace(doc) == []
    assert json.loads(json.dumps(doc)) == doc  # JSON as it stands
    units = [
        e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] != _pid(doc, TRAJECTORIES)
    ]
    assert len(units) == sum(k for _, _, _, k, _ in rows)  # each unit held: one slice


def test_check_trace_finds_an_overlap_and_a_bad_event():
    a = Action("a", {"r": Demand.fixed(1)})
    p = {"r": Placement("n", cores=(0,))}
    two = [ScheduledAction(a, 0, 0, 2, {"r": 1}, p), ScheduledAction(a, 0, 1, 3, {"r": 1}, p)]
    assert any("overlap" in s for s in check_trace(chrome_trace(two)))
    bad = {"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": -1, "name": "x"}]}
    assert check_trace(bad)


def test_every_scenario_replays_to_a_clean_trace(tmp_path, capsys):
    """`tangram replay FILE --trace OUT`, over every scenario file: the simulator's schedule
    as a trace, no unit holding two slices at once."""
    scenarios = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.json"))
    assert scenarios
    for f in scenarios:
        out = tmp_path / f"{f.stem}.json"
        replay.main([str(f), "--trace", str(out)])
        doc = json.loads(out.read_text())
        assert check_trace(doc) == [], f.name
        assert any(e["ph"] == "X" for e in doc["traceEvents"]), f.name
    capsys.readouterr()
