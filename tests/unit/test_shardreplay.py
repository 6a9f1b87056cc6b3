"""`python -m evaluation.shardreplay` (docs/scale.md, "Where the shards' CPU goes") on a small
batch: the shards' recorded messages replay to the same answers, alone and in lockstep."""

from __future__ import annotations

import gc
import pickle
import re

import pytest

from evaluation import shardreplay
from evaluation.engine import Engine
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
    assert "replayed interleaved, batch by batch in this process" in out
    assert handles.shard_main is shard_main  # the recording hook is taken out again


def _messages(out: str) -> int:
    return sum(int(n) for n in re.findall(r"(\d+) messages, replayed", out))


def test_stretched_batches_send_fewer_messages_and_naps_replay_the_same(capsys):
    argv = ["--batch", "512", "--nodes-per-shard", "2", "--warmup", "10", "--window", "4"]
    assert shardreplay.main(argv) == 0
    exact = _messages(capsys.readouterr().out)
    assert shardreplay.main([*argv, "--stretch", "4", "--nap", "0", "0.001"]) == 0
    out = capsys.readouterr().out
    assert 0 < _messages(out) < exact * 0.75  # batches about 4 times as long
    assert "every answer as recorded" in out
    assert "0 ms asleep before each message" in out and "1 ms asleep" in out
    assert Engine.collect_stretch == 1.0  # set back for whatever runs next


@pytest.mark.parametrize("bad", [["--stretch", "0.5"], ["--stretch", "nan"], ["--nap", "-1"]])
def test_a_bad_diagnostic_value_is_refused_naming_it(bad, capsys):
    with pytest.raises(SystemExit):
        shardreplay.main(bad)
    assert bad[0] in capsys.readouterr().err


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
        with pytest.raises(AssertionError, match=r"\(interleaved\): answer 0 differs"):
            shardreplay.interleaved([path])
        assert gc.get_threshold() == (701, 11, 12)
    finally:
        gc.set_threshold(*threshold)


def _tiny_init():

    pools = {"cpu": CorePool("cpu", {"n0": CpuNode.flat("n0", 2)})}
    return ShardInit(pools, get_allocator("heuristic"), 1.0, {}, [], [], [])
