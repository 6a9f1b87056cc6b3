"""DP operators: the state spaces DPArrange runs over (paper, Appendix B).

An operator encodes the free capacity of one resource as a finite set of integer states and
advances a DP layer for one task in one vectorised step. `step` is a *pull or push* over all
states at once; no Python loop runs over (state, amount) pairs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from topology.chunks import chunk_sizes, is_pow2

INF = np.inf


_INDEX_CACHE: dict[bytes, np.ndarray] = {}
_INDEX_CACHE_MAX = 512


def _gather_index(amounts: np.ndarray, pad: int, states: int) -> np.ndarray:
    """Rows t = 0..states-1 of the matrix [t + pad - amounts[j]]: the same allowed amounts recur
    across decisions (an action stays queued), so the matrix is cached per amount set, built
    with spare rows, and sliced (a view) to the states of this operator."""
    key = amounts.tobytes()
    idx = _INDEX_CACHE.get(key)
    if idx is None or idx.shape[0] < states:
        if len(_INDEX_CACHE) >= _INDEX_CACHE_MAX:
            _INDEX_CACHE.clear()
        rows = max(states, 2 * (idx.shape[0] if idx is not None else 0), 64)
        idx = np.arange(rows)[:, None] + (pad - amounts)[None, :]
        _INDEX_CACHE[key] = idx
    return idx[:states]


class FlatOperator:
    """`units` interchangeable free units (the cores of one node). State = units used so far."""

    __slots__ = ("units", "num_states", "initial", "_arange")

    def __init__(self, units: int) -> None:
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 0:
            raise ValueError(f"FlatOperator: units must be a non-negative integer, got {units!r}")
        self.units = int(units)
        self.num_states = self.units + 1
        self.initial = 0
        self._arange = np.arange(self.num_states)

    def __repr__(self) -> str:
        return f"FlatOperator(units={self.units})"

    def step(
        self, prev: np.ndarray, amounts: np.ndarray, durations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One DP layer: new[t] = min_a prev[t - amounts[a]] + durations[a].

        `prev` is read through a copy padded on the left with +inf (as many slots as the largest
        amount), so t - amount < 0 lands on +inf without masking. Returns (new costs, chosen
        amount index, predecessor state) per state; entries of states with infinite cost are
        meaningless (backtracking never reaches them).
        """
        s = self.num_states
        pad = int(amounts.max())
        padded = np.empty(s + pad)
        padded[:pad] = INF
        padded[pad:] = prev
        cand = padded[_gather_index(amounts, pad, s)]
        cand += durations
        choice = cand.argmin(axis=1)
        new = np.take(cand.ravel(), self._arange * len(amounts) + choice)
        return new, choice, self._arange - amounts[choice]

    def units_used(self, state: int) -> int:
        return int(state)


class ChunkOperator:
    """Free aligned chunks by size, pooled across nodes (paper 5.3, with buddy splitting).

    A task of k GPUs (k a power of two) takes one whole chunk of size k, split buddy-style from
    the smallest free chunk that holds it: taking 2 from a free 8 leaves a free 4 and a free 2.
    States are the reachable tuples of free-chunk counts, enumerated once per operator.
    """

    __slots__ = ("sizes", "num_states", "initial", "states", "_next", "_size_col")

    def __init__(self, free: Mapping[int, int]) -> None:
        sizes = sorted(int(s) for s in free)
        for s in sizes:
            if not is_pow2(s):
                raise ValueError(f"ChunkOperator: chunk size must be a power of two, got {s!r}")
            if int(free[s]) < 0:
                raise ValueError(f"ChunkOperator: free[{s}] must be >= 0, got {free[s]!r}")
        top = sizes[-1] if sizes else 1
        self.sizes = chunk_sizes(top)
        self._size_col = {s: i for i, s in enumerate(self.sizes)}
        start = tuple(int(free.get(s, 0)) for s in self.sizes)
        self.states, self._next = self._enumerate(start)
        self.num_states = len(self.states)
        self.initial = 0

    def __repr__(self) -> str:
        return f"ChunkOperator(free={dict(zip(self.sizes, self.states[0]))})"

    def _take(self, state: tuple[int, ...], level: int) -> tuple[int, ...] | None:
        counts = list(state)
        for b in range(level, len(counts)):
            if counts[b]:
                counts[b] -= 1
                for lv in range(level, b):
                    counts[lv] += 1
                return tuple(counts)
        return None

    def _enumerate(self, start: tuple[int, ...]) -> tuple[list[tuple[int, ...]], np.ndarray]:
        index = {start: 0}
        states = [start]
        rows: list[list[int]] = []
        i = 0
        while i < len(states):
            row = []
            for level in range(len(self.sizes)):
                nxt = self._take(states[i], level)
                if nxt is None:
                    row.append(-1)
                    continue
                j = index.get(nxt)
                if j is None:
                    j = index[nxt] = len(states)
                    states.append(nxt)
                row.append(j)
            rows.append(row)
            i += 1
        table = np.array(rows, dtype=np.int64).reshape(len(states), len(self.sizes))
        return states, table

    def step(
        self, prev: np.ndarray, amounts: np.ndarray, durations: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One DP layer pushed forward through the transition table, keeping the cheapest.

        A scatter-min gives each reachable state its least cost; any (state, amount) pair that
        achieves it is a valid choice to backtrack through.
        """
        n = self.num_states
        cols = np.fromiter(
            (self._size_col.get(int(a), -1) for a in amounts), dtype=np.int64, count=len(amounts)
        )
        nxt = self._next[:, np.maximum(cols, 0)]
        if (cols < 0).any():
            nxt = np.where(cols[None, :] >= 0, nxt, -1)
        cost = prev[:, None] + durations[None, :]
        ok = (nxt >= 0) & np.isfinite(cost)
        dst = nxt[ok]
        c = cost[ok]
        new = np.full(n, INF)
        np.minimum.at(new, dst, c)
        # one winner per state, written in one assignment so pred and choice stay paired
        flat = np.flatnonzero(ok)
        best = c == new[dst]
        winner = np.full(n, -1, dtype=np.int64)
        winner[dst[best]] = flat[best]
        k = len(amounts)
        reached = winner >= 0
        pred = np.where(reached, winner // k, -1)
        choice = np.where(reached, winner % k, -1)
        return new, choice, pred

    def units_used(self, state: int) -> int:
        start = self.states[0]
        now = self.states[state]
        return sum(s * (a - b) for s, a, b in zip(self.sizes, start, now))
