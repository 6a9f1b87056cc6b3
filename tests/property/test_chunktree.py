from hypothesis import given, settings
from hypothesis import strategies as st

from topology import ChunkTree, TopologyError, buddy, chunk_sizes, is_aligned, is_pow2, pow2_floor

ops = st.lists(
    st.tuples(st.booleans(), st.sampled_from([1, 2, 3, 4, 8, 16]), st.integers(0, 100)), max_size=40
)


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


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16]), ops, st.integers(0, 15), st.integers(0, 4))
def test_the_buddy_helpers_agree_with_the_free_lists(gpus, seq, start, level):
    """`free_container`, `options` and `smallest_free_level` (what pools and backfilling read)
    say what a brute-force look at the free lists says."""
    t = ChunkTree(gpus, check=False)
    held = []
    for alloc, k, pick in seq:
        if alloc or not held:
            if t.can_allocate(k):
                held.append(t.allocate(k))
        else:
            t.release(held.pop(pick % len(held)))
    size = 1 << level
    chunk = (start - start % size, start - start % size + size)
    if not is_aligned(chunk, gpus):
        assert chunk[1] > gpus
        return
    assert buddy(buddy(chunk)) == chunk
    free_gpus = {g for lv in t.free for s, e in lv for g in range(s, e)}
    inside = t.free_container(chunk)
    assert (inside is not None) == (set(range(*chunk)) <= free_gpus)
    for k in (1, 2, 4, 8, 16):
        options = t.options(k)
        lv = t.smallest_free_level(k)
        assert (lv is None) is (not options) is (not t.can_allocate(k))
        assert all(t.free_container(c) is not None and c[1] - c[0] == k for c in options)
        if options:
            assert min(e - s for s, e in (t.free_container(c) for c in options)) == 1 << lv


@given(st.integers(1, 10_000))
def test_pow2_floor_and_chunk_sizes(n):
    f = pow2_floor(n)
    assert is_pow2(f) and f <= n < 2 * f
    sizes = chunk_sizes(n)
    assert sizes[0] == 1 and sizes[-1] == f and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
