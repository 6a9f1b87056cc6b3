"""The static baseline's continuous batching: replicas serve concurrent calls on lanes, a call
joining n - 1 others on one replica takes n / S(n) of its alone time, S from a published
curve (decode: Millstone's 4.04x at 10 streams; prefill: flat, Sarathi-Serve)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluation.baselines.batching import (
    BatchedReplicas,
    batched_static,
    decode_bound,
    prefill_bound,
)
from evaluation.closedloop import run
from evaluation.experiments.common import batching_static, search_baseline, static_gpu
from evaluation.simulator import modelled_duration
from evaluation.workloads import get_workload
from tangram.allocation import Assignment
from tangram.pools import Placement


def test_decode_curve_passes_through_the_published_point():
    assert decode_bound(1) == 1.0
    assert decode_bound(10) == pytest.approx(853 / 211)  # 4.04x at 10 concurrent streams
    assert prefill_bound(16) == 1.0


@given(st.integers(1, 256))
def test_decode_curve_is_monotone_and_sublinear(n):
    assert 1.0 <= decode_bound(n) <= decode_bound(n + 1) and decode_bound(n) <= n


def test_lanes_pin_each_replica_once_per_lane_and_stretch_joining_calls():
    w = get_workload("deepsearch", batch=4, seed=0)
    wide, static, make = batched_static(w, ["judge"], 1, replicas=8, max_batch=4)
    assert wide.gpu.nodes == 4 * w.gpu.nodes and len(static.pins) == 4 * 8
    assert {n for _, n, _, _ in static.pins} == set(wide.gpu.node_names())
    ex = make(wide)["gpu"]
    assert isinstance(ex, BatchedReplicas)
    judges = [s.action for t in w.trajectories for s in t.steps if s.action.kind == "judge"]
    lanes = wide.gpu.node_names()  # gpu0 (lane 0) and gpu1 (lane 1) are one physical node
    first = Assignment(judges[0], {"gpu": 1}, {"gpu": Placement(lanes[0], chunk=(0, 1))})
    second = Assignment(judges[1], {"gpu": 1}, {"gpu": Placement(lanes[1], chunk=(0, 1))})
    other = Assignment(judges[2], {"gpu": 1}, {"gpu": Placement(lanes[2], chunk=(1, 2))})
    static.attach({}, {"gpu": ex})  # deployed before the run: no restore
    assert ex.begin(first, 0.0) == (0.0, False)
    extra, _ = ex.begin(second, 0.0)  # joins the running call on GPU 0
    alone = modelled_duration(judges[1], {"gpu": 1})
    assert extra == pytest.approx(alone * (2 / decode_bound(2) - 1))
    assert ex.begin(other, 0.0)[0] == 0.0  # another replica (GPU 1): alone
    ex.end(second, 1.0)
    ex.end(first, 1.0)
    assert ex.begin(second, 2.0)[0] == 0.0 and ex.batched == 1


def test_batching_shortens_a_bursty_judge_queue():
    # every trajectory asks its judge at about the same time, on one replica
    w = get_workload("deepsearch", batch=24, calls_mean=10.0, start_spread_s=0.0, seed=3)
    plain = search_baseline(w, static_gpu(["judge"], w, 1, replicas=1))
    wide, b = batching_static("static-1-batching", ["judge"], w, 1, replicas=1)
    batching = search_baseline(wide, b.allocator, b.executors)
    judge = lambda r: r.mean_act("judge")
    assert judge(run(wide, batching)) < judge(run(w, plain))
