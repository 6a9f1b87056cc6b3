"""A pool of warm, never-used sandboxes for `/run_code`: no sandbox set-up on a request's path.

Opening an environment (a cgroup, a bubblewrap sandbox with its mounts and namespaces) costs
milliseconds to tens of milliseconds under load; a fresh request takes an environment that was
opened before it arrived and is closed after it, as before: every sandbox serves one request
only, so isolation between requests is the same as with a fresh one. The pool is refilled by
one background task, off the requests' path: it starts when a request is done (after the
used environment is closed, also in the background, once the response is on its way), so it
does not compete with a request's run for the cores; when the pool is empty a request opens its
own (never waits for the refill); when requests drain it below half, the refill starts at once,
beside them. Only requests at the pool's memory size take from it (the server's
default: `memory_limit_MB` -1, or the same number); others open their own. The refill opens
the missing sandboxes side by side.

Size: `TANGRAM_SANDBOXFUSION_WARM` (default `DEFAULT_SIZE`; 0 turns the pool off). Each warm
sandbox holds its memory reservation while it waits, so the pool is small, and a request whose
memory does not fit closes warm ones until it does, or waits for a used one being closed in the
background (a request never fails for the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
import weakref
from collections import deque
from typing import Any

from tangram.errors import Infeasible, TangramError

log = logging.getLogger("tangram.runtime.sandboxfusion")

DEFAULT_SIZE = 4
TRAJECTORY_PREFIX = "sandboxfusion-"


def fresh_trajectory() -> str:
    return f"{TRAJECTORY_PREFIX}{uuid.uuid4().hex[:12]}"


class WarmPool:
    """Up to `size` open, never-used environments of `memory_mb` on `tg` (a `Tangram`)."""

    def __init__(self, tg: Any, memory_mb: int, size: int) -> None:
        self.tg, self.memory_mb, self.size = tg, memory_mb, size
        self._ready: deque[tuple[str, float]] = deque()
        self._refill: asyncio.Task | None = None
        self._again = False  # a refill was asked for while one ran
        self._closing: set[asyncio.Task] = set()
        self.hits = self.misses = 0

    async def take(self, memory_mb: int) -> str:
        """A never-used environment of `memory_mb`: a warm one when there is one, else one
        opened now. The caller owns it (and closes it)."""
        if memory_mb == self.memory_mb:
            env = self._pop()
            if len(self._ready) * 2 < self.size:  # draining faster than it refills: start now
                self._start_refill()
            if env is not None:
                self.hits += 1
                return env
            self.misses += 1
        while True:
            try:
                return await self.tg.open_env(fresh_trajectory(), memory_mb)
            except Infeasible:
                # the memory a request needs comes before the pool's: take a warm one that
                # fits or give one back, else wait for the background (a used one being
                # closed, the refill) to let go of memory or to bring a warm one
                env = self._pop()
                if env is not None and memory_mb == self.memory_mb:
                    return env
                if env is not None:
                    await self._close(env)
                    continue
                pending = set(self._closing)
                if self._refill is not None and not self._refill.done():
                    pending.add(self._refill)
                if not pending:
                    raise
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)

    def _pop(self) -> str | None:
        idle = getattr(self.tg, "idle_env_s", None)
        while self._ready:
            env, opened = self._ready.popleft()
            # the facade's idle reaper may close a warm one that waited too long: skip those
            if idle and time.monotonic() - opened > idle / 2:
                asyncio.ensure_future(self._close(env))
                continue
            return env
        return None

    async def _close(self, env: str) -> None:
        with contextlib.suppress(TangramError):
            await self.tg.close_env(env)

    def release(self, env: str) -> None:
        """Close a used environment after its response is sent, then refill: both off the
        request's path (the next request does not wait for either)."""
        task = asyncio.ensure_future(self._release(env))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _release(self, env: str) -> None:
        await self._close(env)
        self._start_refill()

    def _start_refill(self) -> None:
        if self._refill is None or self._refill.done():
            self._refill = asyncio.ensure_future(self._fill())
        else:  # memory may have come back since the running refill tried: it goes round again
            self._again = True

    async def _fill(self) -> None:
        """Open the missing ones side by side (a sandbox's start is mostly kernel set-up, not
        CPU: one after another the refill would cap the request rate), until the pool is
        full or an open fails; once more if a close asked for a refill meanwhile (an open that
        failed for memory may succeed now)."""
        again = True
        while again:
            self._again = False
            while len(self._ready) < self.size:
                wanted = self.size - len(self._ready)
                opened = await asyncio.gather(*(self._open_one() for _ in range(wanted)))
                if not all(opened):
                    break
            again = self._again

    async def _open_one(self) -> bool:
        try:
            env = await self.tg.open_env(fresh_trajectory(), self.memory_mb)
        except TangramError as exc:  # shutting down, memory taken by running requests
            log.debug("warm pool: not refilled (%s)", exc)
            return False
        self._ready.append((env, time.monotonic()))
        return True

    @property
    def idle(self) -> int:
        """Warm environments waiting for a request."""
        return len(self._ready)

    @property
    def filling(self) -> bool:
        """Refilling, or closing used environments, in the background."""
        return bool(self._closing) or (self._refill is not None and not self._refill.done())

    def warm(self) -> None:
        """Start filling (the first request does it too)."""
        self._start_refill()


_POOLS: weakref.WeakKeyDictionary[Any, WarmPool] = weakref.WeakKeyDictionary()


def warm_pool(tg: Any, memory_mb: int) -> WarmPool | None:
    """The pool of `tg` (created on first use), or None when it is turned off."""
    pool = _POOLS.get(tg)
    if pool is None:
        size = int(os.environ.get("TANGRAM_SANDBOXFUSION_WARM", DEFAULT_SIZE))
        if size <= 0:
            return None
        pool = _POOLS[tg] = WarmPool(tg, memory_mb, size)
    return pool
