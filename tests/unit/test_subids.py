"""Subordinate uids (`managers.cpu.subids`): the user's range read from subuid/subgid files, a
missing one refused naming the file and the fix; uids handed out by several servers of one user
(each an allocator over the same claim folder) are never held by two environments at once, a
dead server's claims are taken over and a live one's never are, and released uids come back
only after the rest of the range went round."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.cpu import subids
from managers.cpu.subids import SubIds, SubUidAllocator
from tangram.errors import BackendUnavailable


def _files(tmp_path, uid_line: str | None, gid_line: str | None):
    u, g = tmp_path / "subuid", tmp_path / "subgid"
    u.write_text(uid_line or "someone:100000:65536\n")
    g.write_text(gid_line or "someone:100000:65536\n")
    return str(u), str(g)


def test_the_users_range_is_read_by_name_or_uid(tmp_path, monkeypatch):
    monkeypatch.setattr(subids.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    uid = os.getuid()
    u, g = _files(tmp_path, f"x:1:2\n{uid}:300000:1000\n", f"{uid}:400000:2000\n")
    ids = subids.subids(u, g)
    assert (ids.uid, ids.gid, ids.count) == (300000, 400000, 1000)


def test_a_missing_range_names_the_file_and_the_fix(tmp_path):
    u, g = _files(tmp_path, "nobody-here:1:2\n", None)
    with pytest.raises(BackendUnavailable, match="no subordinate id range in .*subuid.*usermod"):
        subids.subids(u, g)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(0, 30)), max_size=60))
def test_no_uid_is_held_twice_across_servers(tmp_path_factory, steps):
    folder = tmp_path_factory.mktemp("claims")
    ids = SubIds("u", 500000, 600000, 12)
    servers = [SubUidAllocator(ids, folder) for _ in range(3)]
    held: dict[int, int] = {}  # uid -> the server holding it
    for who, take, pick in steps:
        server = servers[who]
        if take:
            try:
                uid = server.take()
            except BackendUnavailable:
                assert len(held) == ids.count - 1  # refused only when every uid is held
                continue
            assert uid not in held and ids.uid < uid < ids.uid + ids.count
            assert server.gid_of(uid) == ids.gid + uid - ids.uid
            held[uid] = who
        else:
            mine = sorted(u for u, w in held.items() if w == who)
            if mine:
                uid = mine[pick % len(mine)]
                server.release(uid)
                del held[uid]


def test_a_released_uid_comes_back_only_after_the_range_went_round(tmp_path):
    ids = SubIds("u", 500000, 600000, 5)
    alloc = SubUidAllocator(ids, tmp_path)
    first = alloc.take()
    alloc.release(first)
    seen = [alloc.take() for _ in range(3)]
    assert first not in seen
    for uid in seen:
        alloc.release(uid)
    assert alloc.take() == first  # the range (4 uids) went round


def test_a_dead_servers_claims_are_taken_over_and_a_live_ones_never(tmp_path):
    ids = SubIds("u", 500000, 600000, 3)  # uids 500001 and 500002
    folder = tmp_path / "tangram-uids"
    folder.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / "1").write_text(f"{dead.pid} 1")  # a server that is gone
    (folder / "2").write_text(f"{os.getpid()} {subids._start_time(os.getpid())}")  # live
    alloc = SubUidAllocator(ids, tmp_path)
    assert alloc.take() == 500001
    with pytest.raises(BackendUnavailable, match="held by an open environment"):
        alloc.take()
