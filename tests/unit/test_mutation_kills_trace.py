"""The trace's exact content for a small schedule, and each thing `check_trace` finds (killing
what mutation testing of `tangram/trace.py` found no test noticing)."""

from __future__ import annotations

from tangram.actions import Action
from tangram.pools import Placement
from tangram.resources import Demand
from tangram.results import ScheduledAction, Status
from tangram.trace import check_trace, chrome_trace


def _schedule() -> list[ScheduledAction]:
    cores = Action("a1", {"cpu": Demand.fixed(2)}, trajectory="t1", kind="exec")
    api = Action("a2", {"api": Demand.fixed(1)}, kind="call")  # no trajectory, no placement
    gpu = Action("a3", {"gpu": Demand.fixed(2)}, trajectory="t1")
    return [
        ScheduledAction(cores, 1.0, 1.5, 2.25, {"cpu": 2}, {"cpu": Placement("n", cores=(4, 5))}),
        ScheduledAction(api, 2.0, 2.0, 3.0, {"api": 1}, status=Status.ERROR),
        ScheduledAction(gpu, 3.0, 3.0, 4.0, {"gpu": 2}, {"gpu": Placement("g", chunk=(2, 4))}),
    ]


def test_the_trace_of_a_small_schedule_event_by_event():
    doc = chrome_trace(_schedule())
    assert doc["displayTimeUnit"] == "ms"
    ev = doc["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in ev if e.get("name") == "process_name"}
    assert procs == {"cpu@n": 1, "trajectories": 2, "api": 3, "gpu@g": 4}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"
    }
    assert threads == {
        (1, 1): "core 4", (1, 2): "core 5", (2, 1): "t1", (3, 1): "slot 0", (2, 2): "a2",
        (4, 1): "gpu 2", (4, 2): "gpu 3",
    }  # fmt: skip
    slices = [(e["pid"], e["tid"], e["name"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X"]
    assert slices == [
        (1, 1, "exec", 500000.0, 750000.0),
        (1, 2, "exec", 500000.0, 750000.0),
        (2, 1, "queued", 0.0, 500000.0),  # it waited 0.5 s: the first arrival is time 0
        (2, 1, "exec", 500000.0, 750000.0),
        (3, 1, "call", 1000000.0, 1000000.0),
        (2, 2, "call", 1000000.0, 1000000.0),  # no trajectory: its own track; no wait slice
        (4, 1, "default", 2000000.0, 1000000.0),  # an action's default kind
        (4, 2, "default", 2000000.0, 1000000.0),
        (2, 1, "default", 2000000.0, 1000000.0),
    ]
    first = next(e for e in ev if e["ph"] == "X")
    assert first["args"] == {
        "action": "a1", "kind": "exec", "units": {"cpu": 2}, "status": "ok", "queued_ms": 500.0
    }  # fmt: skip
    assert all(e["args"]["action"] for e in ev if e["ph"] == "X")  # queued, run, units alike
    call = next(e for e in ev if e["ph"] == "X" and e["name"] == "call")
    assert call["args"]["status"] == "error" and call["args"]["queued_ms"] == 0.0
    assert all(set(e) >= {"pid", "tid", "ph", "name", "args"} for e in ev if e["ph"] == "M"
               and e["name"] == "thread_name")  # fmt: skip
    assert check_trace(doc) == []


def test_times_keep_microseconds_to_a_thousandth():
    a = Action("a", {"cpu": Demand.fixed(1)})
    r = ScheduledAction(a, 0.0, 0.0000012345, 0.5, {"cpu": 1}, {"cpu": Placement("n", cores=(0,))})
    x = next(e for e in chrome_trace([r])["traceEvents"] if e["ph"] == "X")
    assert x["ts"] == 1.234 or x["ts"] == 1.235  # round(1.2345, 3) (float)
    assert chrome_trace([])["traceEvents"] == []


def test_check_trace_names_each_fault_and_goes_on_after_one():
    good = {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "cpu@n"}}
    x = {"name": "s", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1}
    for bad, says in (
        ({**x, "ph": "B"}, "bad event"),
        ({**x, "pid": "1"}, "bad event"),
        ({**x, "name": 5}, "bad slice"),
        ({**x, "dur": -1}, "bad slice"),
        ({**x, "ts": -1}, "bad slice"),
        ({k: v for k, v in x.items() if k != "ts"}, "bad slice"),
        ({k: v for k, v in x.items() if k != "dur"}, "bad slice"),
        ({**x, "tid": None}, "bad slice"),
        ({**x, "pid": 9}, "unnamed process"),
    ):
        found = check_trace({"traceEvents": [good, bad, {**x, "ts": 0.5}, {**x, "ts": 0.9}]})
        assert any(says in f for f in found), (bad, found)
        assert any("overlap" in f for f in found), (bad, found)  # the events after it checked
    assert check_trace({"traceEvents": [good, x, {**x, "ts": 1}]}) == []  # end to start: fine
    assert check_trace({}) == []
