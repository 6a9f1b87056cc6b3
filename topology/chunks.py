"""The GPU chunk tree of one node: aligned power-of-two intervals, buddy split and merge.

HiveD-style multi-level cells (paper 5.3): a node of G GPUs (G a power of two) starts as one
free chunk (0, G). A request of k GPUs takes a free chunk of level a = ceil(log2 k), splitting the
smallest free chunk of a level b >= a. Freeing a chunk merges it with its buddy while the buddy is
free. The tree of all intervals is a networkx DiGraph (parent -> children), the form the exact
solvers read; per-level free lists hold the state. Invariants are checked after every mutation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import networkx as nx

from topology.errors import InvariantViolation, TopologyError

Chunk = tuple[int, int]


def chunk_level(k: int) -> int:
    """Level of the smallest power-of-two chunk holding k GPUs."""
    if k <= 0:
        raise TopologyError(f"a GPU request must be positive, got {k!r}")
    return (k - 1).bit_length()


def is_pow2(k: int) -> bool:
    """Whether k GPUs make one whole chunk (k a positive power of two)."""
    return k > 0 and not k & (k - 1)


def pow2_floor(n: int) -> int:
    """The largest power of two <= n (n >= 1): how many GPUs of n make one chunk tree."""
    if n <= 0:
        raise TopologyError(f"a GPU count must be positive, got {n!r}")
    return 1 << (n.bit_length() - 1)


def chunk_sizes(num_gpus: int) -> tuple[int, ...]:
    """Every chunk size up to `num_gpus`: 1, 2, 4, ... (the DoPs a node's chunks allow)."""
    return tuple(1 << i for i in range(num_gpus.bit_length()))


def is_aligned(chunk: Chunk, num_gpus: int) -> bool:
    """Whether `chunk` is an aligned power-of-two interval of a node of `num_gpus` GPUs."""
    s, e = chunk
    return is_pow2(e - s) and s >= 0 and not s % (e - s) and e <= num_gpus


def buddy(chunk: Chunk) -> Chunk:
    """The other half of `chunk`'s parent."""
    size = chunk[1] - chunk[0]
    s = chunk[0] ^ size
    return (s, s + size)


def enclosing(chunk: Chunk, level: int) -> Chunk:
    """The aligned chunk of level `level` (>= the chunk's own) that contains `chunk`."""
    size = 1 << level
    s = chunk[0] - chunk[0] % size
    return (s, s + size)


def build_chunk_graph(num_gpus: int) -> nx.DiGraph:
    """All aligned intervals of a node with `num_gpus` GPUs, edges parent -> the two halves."""
    g = nx.DiGraph()
    size = num_gpus
    level = num_gpus.bit_length() - 1
    while size >= 1:
        for start in range(0, num_gpus, size):
            g.add_node((start, start + size), level=level, size=size)
            if size < num_gpus:
                parent_size = size * 2
                ps = start - start % parent_size
                g.add_edge((ps, ps + parent_size), (start, start + size))
        size //= 2
        level -= 1
    return g


class ChunkTree:
    """Free/used state of one GPU node's chunk tree, with buddy allocation."""

    def __init__(self, num_gpus: int, node: str = "gpu0", check: bool = True) -> None:
        if num_gpus <= 0 or num_gpus & (num_gpus - 1):
            raise TopologyError(f"GPUs per node must be a power of two, got {num_gpus!r}")
        self.node = node
        self.num_gpus = num_gpus
        self.levels = num_gpus.bit_length()  # levels 0 .. levels-1
        self.free: list[set[Chunk]] = [set() for _ in range(self.levels)]
        self.free[self.levels - 1].add((0, num_gpus))
        self.used: set[Chunk] = set()
        self.check_invariants = check
        self._graph: nx.DiGraph | None = None

    # -- views -------------------------------------------------------------------------------
    @property
    def graph(self) -> nx.DiGraph:
        if self._graph is None:
            self._graph = build_chunk_graph(self.num_gpus)
        return self._graph

    def free_counts(self) -> dict[int, int]:
        return {1 << lv: len(s) for lv, s in enumerate(self.free)}

    def free_gpus(self) -> int:
        return sum(len(s) << lv for lv, s in enumerate(self.free))

    def largest_free(self) -> int:
        for lv in range(self.levels - 1, -1, -1):
            if self.free[lv]:
                return 1 << lv
        return 0

    def can_allocate(self, k: int) -> bool:
        return self.smallest_free_level(k) is not None

    def smallest_free_level(self, k: int) -> int | None:
        """The lowest level >= level(k) that has a free chunk (None: k GPUs do not fit)."""
        return next((b for b in range(chunk_level(k), self.levels) if self.free[b]), None)

    def options(self, k: int) -> list[Chunk]:
        """The chunks a request of k GPUs could take, in start order: every aligned
        ceil-pow2(k) sub-chunk of every free chunk of the smallest level that holds one."""
        b = self.smallest_free_level(k)
        if b is None:
            return []
        size = 1 << chunk_level(k)
        return sorted((s, s + size) for (p0, p1) in self.free[b] for s in range(p0, p1, size))

    def free_container(self, chunk: Chunk) -> Chunk | None:
        """The free chunk that contains the aligned `chunk` (None: some of it is in use)."""
        for b in range((chunk[1] - chunk[0]).bit_length() - 1, self.levels):
            parent = enclosing(chunk, b)
            if parent in self.free[b]:
                return parent
        return None

    def copy(self) -> ChunkTree:
        t = ChunkTree.__new__(ChunkTree)
        t.node = self.node
        t.num_gpus = self.num_gpus
        t.levels = self.levels
        t.free = [set(s) for s in self.free]
        t.used = set(self.used)
        t.check_invariants = self.check_invariants
        t._graph = self._graph
        return t

    # -- mutations ---------------------------------------------------------------------------
    def allocate(self, k: int, score: Callable[[Chunk], float] | None = None) -> Chunk:
        """Take one aligned chunk of ceil-pow2(k) GPUs from the smallest free level that holds it.

        Among the chunks this could yield (any aligned sub-chunk of any free chunk of that
        smallest level), `score` picks the highest; ties go to the lowest start.
        """
        a = chunk_level(k)
        if a >= self.levels:
            raise TopologyError(f"{self.node}: {k} GPUs exceed the node's {self.num_gpus}")
        options = self.options(k)
        if not options:
            raise TopologyError(f"{self.node}: no free chunk of {1 << a} GPUs")
        target = max(options, key=score) if score is not None else options[0]
        self.take(target)
        return target

    def take(self, chunk: Chunk) -> None:
        """Mark exactly `chunk` used, splitting the free chunk that contains it."""
        if not is_aligned(chunk, self.num_gpus):
            raise TopologyError(f"{self.node}: {chunk} is not an aligned chunk of this node")
        parent = self.free_container(chunk)
        if parent is None:
            raise TopologyError(f"{self.node}: chunk {chunk} is not free")
        s, a = chunk[0], (chunk[1] - chunk[0]).bit_length() - 1
        b = (parent[1] - parent[0]).bit_length() - 1
        self.free[b].remove(parent)
        # split down toward the target, freeing the sibling halves
        lo, hi = parent
        for lv in range(b - 1, a - 1, -1):
            half = 1 << lv
            left, right = (lo, lo + half), (lo + half, hi)
            if s < lo + half:
                self.free[lv].add(right)
                lo, hi = left
            else:
                self.free[lv].add(left)
                lo, hi = right
        self.used.add(chunk)
        self._check()

    def release(self, chunk: Chunk) -> None:
        """Free a used chunk and merge buddies upward."""
        if chunk not in self.used:
            raise TopologyError(f"{self.node}: chunk {chunk} is not in use")
        self.used.remove(chunk)
        s, e = chunk
        size = e - s
        lv = size.bit_length() - 1
        while lv < self.levels - 1:
            other = buddy((s, s + size))
            if other not in self.free[lv]:
                break
            self.free[lv].remove(other)
            s = min(s, other[0])
            size *= 2
            lv += 1
        self.free[lv].add((s, s + size))
        self._check()

    # -- invariants --------------------------------------------------------------------------
    def _check(self) -> None:
        if self.check_invariants:
            self.verify()

    def verify(self) -> None:
        """Aligned chunks, no overlap, free + used = all GPUs, no unmerged free buddies."""
        covered = [0] * self.num_gpus
        chunks: Iterable[Chunk] = [c for s in self.free for c in s] + list(self.used)
        for lv, level_free in enumerate(self.free):
            for c in level_free:
                if c[1] - c[0] != 1 << lv:
                    raise InvariantViolation(f"{self.node}: free chunk {c} filed at level {lv}")
                if lv < self.levels - 1 and buddy(c) in level_free:
                    raise InvariantViolation(f"{self.node}: free buddies {c} {buddy(c)} unmerged")
        for start, end in chunks:
            if not is_aligned((start, end), self.num_gpus):
                raise InvariantViolation(f"{self.node}: chunk {(start, end)} is not aligned")
            for g in range(start, end):
                covered[g] += 1
        if any(c != 1 for c in covered):
            raise InvariantViolation(f"{self.node}: GPU coverage {covered} (free+used != all)")
