"""Shards from the config file, `Tangram.local()` and `tangram serve --shards` (docs/scale.md):
the count reaches the scheduler, and a bad one fails naming the field."""

from __future__ import annotations

import asyncio

import pytest

from tangram.errors import ValidationError
from tangram.runtime import server
from tangram.runtime.config import build, load_config
from tangram.runtime.facade import Tangram
from tangram.runtime.shards import ShardedScheduler
from tangram.scheduler import Scheduler


def test_the_config_key_reaches_the_scheduler(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cpu: {backend: sim}\nshards: 1\n")
    comp = load_config(path)
    assert comp.shards == 1
    tg = Tangram(**comp.kwargs())
    try:
        assert isinstance(tg.scheduler, ShardedScheduler) and len(tg.scheduler.shard_pids()) == 1
        assert tg.scheduler.backend == "process"
    finally:
        asyncio.run(tg.shutdown())
    assert build({"cpu": {"backend": "sim"}}).shards == 0  # absent: one process


@pytest.mark.parametrize("bad", [-1, "two", 1.5, True])
def test_a_bad_shard_count_names_the_field(bad):
    with pytest.raises(ValidationError) as e:
        build({"cpu": {"backend": "sim"}, "shards": bad})
    assert e.value.field == "shards" and e.value.value is bad


def test_local_takes_shards_and_refuses_more_than_the_nodes():
    tg = Tangram.local(cpu_backend="sim", shards=1)
    try:
        assert isinstance(tg.scheduler, ShardedScheduler)
    finally:
        asyncio.run(tg.shutdown())
    assert isinstance(Tangram.local(cpu_backend="sim").scheduler, Scheduler)
    with pytest.raises(ValidationError) as e:  # this machine is one node
        Tangram.local(cpu_backend="sim", shards=2)
    assert e.value.field == "shards" and "more shards than the 1 nodes" in str(e.value)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--shards", "-1"], "--shards must be >= 0"),
        (["--shards", "2", "--config", "x.yaml"], "set `shards: N` in the config file"),
        (["--shards", "two"], "invalid int value"),
    ],
)
def test_serve_refuses_a_bad_shards_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        server.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err
