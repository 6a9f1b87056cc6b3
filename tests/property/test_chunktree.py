from hypothesis import given, settings
from hypothesis import strategies as st

from topology import ChunkTree, TopologyError

ops = st.lists(st.tuples(st.booleans(), st.sampled_from([1, 2, 3, 4, 8, 16]),
                         st.integers(0, 100)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16]), ops)
def test_any_sequence_keeps_invariants_and_freeing_all_restores_one_chunk(gpus, seq):
    t = ChunkTree(gpus)
    held = []
    for alloc, k, pick in seq:
        if alloc or not held:
            before = t.free_gpus()
            try:
                c = t.allocate(k)
            except TopologyError:
                assert not t.can_allocate(k)
                continue
            size = 1 << (k - 1).bit_length()
            assert c[1] - c[0] == size and c[0] % size == 0
            assert t.free_gpus() == before - size
            held.append(c)
        else:
            t.release(held.pop(pick % len(held)))
        t.verify()
        used = sum(e - s for s, e in t.used)
        assert used + t.free_gpus() == gpus
    for c in held:
        t.release(c)
    assert t.free_counts()[gpus] == 1 and t.free_gpus() == gpus and not t.used
