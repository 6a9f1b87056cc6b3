"""A virtual-time asyncio event loop: the runtime's own code on the simulator's clock.

`VirtualTimeLoop.time()` is a number that moves only when the loop would otherwise wait: when no
callback is ready, the loop jumps to its next timer instead of sleeping. So `asyncio.sleep(60)`
returns at once with `loop.time()` 60 s later, and `Tangram` built with `clock=loop.time` on
`sim` backends runs production code (the facade, the managers, the scheduler) on virtual time:
what the experiments need to exercise the runtime end to end, and what the property test
`tests/property/test_runtime_matches_simulator.py` uses to compare the runtime's grants with
the simulator's. Only for code that waits on timers alone: a real socket or a thread would be
overtaken by the clock (there is nothing to wait for but them, and the loop never sleeps).
"""

from __future__ import annotations

import asyncio
import selectors


class _NoWaitSelector(selectors.DefaultSelector):
    """Polls instead of blocking, and moves the loop's clock by the time it would have slept."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if not events and timeout is not None and timeout > 0:
            self._loop.now += timeout
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        super().__init__(selector=_NoWaitSelector(self))

    def time(self) -> float:
        return self.now


def run(main, start: float = 0.0):
    """`asyncio.run(main)` on a fresh virtual-time loop; returns what `main` returns."""
    loop = VirtualTimeLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
