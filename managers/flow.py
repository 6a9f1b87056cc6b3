"""Flow control that learns an upstream's limit from its answers, the way TCP finds its window.

An API's real limit is often not what its documentation (or our configuration) says, and it can
change while we run. `AimdWindow` keeps a concurrency window: additive increase (one more call
in flight per window's worth of answered calls), multiplicative decrease (half) on an answer of
429, and a pause for the `Retry-After` the upstream asked for. Unlike TCP it also remembers a
*ceiling*: a 429 for a call sent with `n` of ours already in flight says the limit is at most
`n`, so the window stops there instead of probing past it forever. After `probe_after` answered
calls at the ceiling without a 429 the ceiling is lifted and additive increase probes again (the
limit may have risen); a probe that draws a 429 doubles the wait before the next one, so with
a steady limit the 429s thin out to none. Only a 429 for a call sent after the last decrease
counts (TCP's one cut per window): a burst refused together halves the window once.

`AimdWindow` is pure (every method takes `now`), so the simulator's flow control and the API
manager's share it; `WindowGate` is the asyncio gate the API manager puts around each attempt.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from tangram.errors import ValidationError


@dataclass
class AimdWindow:
    """The learned concurrency window of one upstream.

    `initial`: the window to start with (the configured limit: it may be wrong). `ceiling`
    records where the last 429 put the limit (None: no ceiling, probing up to `most`)."""

    initial: int
    probe_after: int = 64
    floor: int = 1
    most: int | None = None  # never above this (what the caller can put in flight anyway)
    window: float = field(init=False)
    ceiling: int | None = field(default=None, init=False)
    paused_until: float = field(default=-math.inf, init=False)
    refused: int = field(default=0, init=False)  # answers of 429 heard
    cuts: int = field(default=0, init=False)  # multiplicative decreases made
    _last_cut: float = field(default=-math.inf, init=False)
    _streak: int = field(default=0, init=False)  # answered calls at the ceiling since a cut
    _probe_after: int = field(init=False)
    _probing: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        for name in ("initial", "probe_after", "floor", "most"):
            v = getattr(self, name)
            if v is None and name == "most":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValidationError(f"flow.{name}", v, "must be a positive integer")
        self.window = float(self.initial)
        self._probe_after = self.probe_after

    def allowed(self, now: float) -> int:
        """How many calls may be in flight now (0 while the upstream's Retry-After runs)."""
        if now < self.paused_until:
            return 0
        return max(self.floor, int(self.window))

    def answered(self, now: float) -> None:
        """A call was answered without 429: grow the window (up to the ceiling)."""
        top = min(
            math.inf if self.ceiling is None else self.ceiling,
            math.inf if self.most is None else self.most,
        )
        if self.window < top:
            self.window = min(top, self.window + 1.0 / self.window)
            return
        self._streak += 1
        if self._streak >= self._probe_after:  # quiet at the ceiling long enough: probe above
            self.ceiling, self._streak, self._probing = None, 0, True

    def refused_answer(
        self, sent_at: float, in_flight_before: int, retry_after_s: float, now: float
    ) -> None:
        """A call sent at `sent_at`, with `in_flight_before` of ours already in flight, was
        answered 429 asking to wait `retry_after_s`."""
        self.refused += 1
        self.paused_until = max(self.paused_until, now + max(0.0, retry_after_s))
        # every 429 bounds the limit: it was reached with `in_flight_before` of ours in flight
        bound = max(self.floor, in_flight_before)
        self.ceiling = bound if self.ceiling is None else min(self.ceiling, bound)
        self.window = min(self.window, float(self.ceiling))
        if sent_at < self._last_cut:
            return  # sent before the last decrease: that cut already answered it
        if self._probing:
            self._probe_after *= 2  # the limit has not risen: probe half as often
        self._probing = False
        self.window = max(float(self.floor), self.window / 2.0)
        self._streak = 0
        self._last_cut = now
        self.cuts += 1


class WindowGate:
    """At most `window.allowed(now)` attempts in flight, FIFO; `clock` must be monotonic."""

    def __init__(self, window: AimdWindow, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.in_flight = 0
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def attempt(self) -> AsyncIterator[tuple[float, int]]:
        """Hold one place for one attempt; yields (sent_at, ours in flight before it)."""
        async with self._changed:
            while True:
                now = self.clock()
                if self.in_flight < self.window.allowed(now):
                    break
                wait = self.window.paused_until - now if now < self.window.paused_until else None
                try:
                    await asyncio.wait_for(self._changed.wait(), wait)
                except TimeoutError:
                    pass
            before = self.in_flight
            self.in_flight += 1
        try:
            yield self.clock(), before
        finally:
            async with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    async def tell(self) -> None:
        """The window changed (grew, or a pause ended early): wake the waiters."""
        async with self._changed:
            self._changed.notify_all()
