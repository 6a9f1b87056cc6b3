"""`python -m evaluation.shardreplay` (docs/scale.md, "Where the shards' CPU goes") on a small
batch: the shards' recorded messages replay to the same answers, alone and in lockstep."""

from __future__ import annotations

import gc
import pickle

import pytest

from evaluation import shardreplay
from solvers import get_allocator
from tangram.pools import CorePool
from tangram.runtime.shards import handles
from tangram.runtime.shards.wire import STATE, wire_dumps
from tangram.runtime.shards.worker import ShardInit, shard_main
from topology import CpuNode


def test_the_recorded_shards_replay_to_the_same_answers(capsys):
    argv = ["--batch", "512", "--nodes-per-shard", "1", "--warmup", "10", "--window", "4"]
    assert shardreplay.main([*argv, "--lockstep", "none", "sleep"]) == 0
    out = capsys.readouterr().out
    assert "every answer as recorded" in out
    assert out.count("messages, replayed") == 4  # 4 nodes, one shard each
    assert out.count(", 0 cyclic objects left") == 4  # a shard makes no cyclic garbage
    assert "in lockstep, none between batches" in out and "sleep between batches" in out
    assert handles.shard_main is shard_main  # the recording hook is taken out again


def test_a_replay_that_answers_otherwise_is_refused(tmp_path):

    path = tmp_path / "shard-1.pkl"
    start = wire_dumps(_tiny_init())
    with open(path, "wb") as f:
        pickle.dump((start, [wire_dumps((STATE,))], [wire_dumps((["x"], []))]), f)
    threshold = gc.get_threshold()
    gc.set_threshold(701, 11, 12)  # not a shard's: the replay must set it back
    try:
        with pytest.raises(AssertionError, match="differs from the recorded one"):
            shardreplay.replay(path)
        assert gc.get_threshold() == (701, 11, 12)
    finally:
        gc.set_threshold(*threshold)


def _tiny_init():

    pools = {"cpu": CorePool("cpu", {"n0": CpuNode.flat("n0", 2)})}
    return ShardInit(pools, get_allocator("heuristic"), 1.0, {}, [], [], [])
