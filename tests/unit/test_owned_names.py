"""Names that survive a crash carry their server's tag, never its PID where a key seals it
(`managers.cpu.leftovers`): the tag reads back to the PID with the host's key only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from managers.cpu import leftovers

PIDS = st.integers(min_value=1, max_value=(1 << 22) - 1)  # the kernel's PID_MAX_LIMIT


@given(pid=PIDS)
def test_a_sealed_tag_reads_back_and_names_no_pid(pid) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(leftovers, "_key", lambda: b"k" * 32)
        tag = leftovers.server_tag(pid)
        assert tag.startswith(leftovers.SEALED) and len(tag) == 11
        assert int(tag[1:7], 16) != pid  # permuted, not the PID in hex (nor in decimal)
        assert leftovers.tag_owner(tag) == pid
        name = leftovers.owned_name("env-abc", pid)
        assert leftovers.dead_owner(name) in (None, pid)  # gone or not: this PID's


def test_a_tag_sealed_with_another_key_or_none_is_no_ones() -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(leftovers, "_key", lambda: b"a" * 32)
        tags = [leftovers.server_tag(pid) for pid in range(1000, 3000)]
        mp.setattr(leftovers, "_key", lambda: b"b" * 32)
        misread = [t for t in tags if leftovers.tag_owner(t) is not None]
        assert len(misread) <= 2, misread  # a 16-bit check: one in 65,536 passes by chance
        mp.setattr(leftovers, "_key", lambda: None)  # not root: no key, the PID is the tag
        assert all(leftovers.tag_owner(t) is None for t in tags)
        assert leftovers.server_tag(1234) == "1234" and leftovers.tag_owner("1234") == 1234
