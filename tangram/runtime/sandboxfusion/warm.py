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

Reuse (`TANGRAM_SANDBOXFUSION_REUSE`, default `DEFAULT_REUSE` requests per sandbox; 1: each
used once): where the CPU backend can reset a sandbox (bwrap: `managers.cpu.backends.
bwrap.reset`, which kills every process the request left, removes every file of its work
folder, `/tmp` and `/dev/shm` and its System V IPC objects), a used sandbox of the pool's size
is reset in the background and goes back to the pool instead of being closed and replaced:
building and tearing down a sandbox costs ~15 ms of CPU, more than the `print(1)` it runs. A
sandbox whose reset fails is closed (the reason at debug level). The pool's environments are
the server's own: `/run_code`'s `env_id` and the `/v1/envs/{env_id}` routes refuse them
(`pooled`), so an earlier client that saw an id in its response cannot reach a later request's
sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import deque
from typing import Any

from managers.cpu.environments import WARM_POOL, EnvRecord
from tangram.errors import Infeasible, TangramError

log = logging.getLogger("tangram.runtime.sandboxfusion")

DEFAULT_SIZE = 4
DEFAULT_REUSE = 64
RESET_WAIT_S = 0.05  # how long a request waits for a sandbox being reset (~1 ms) before it
# opens its own (~15 ms of CPU)
TRAJECTORY_PREFIX = "sandboxfusion-"
POOLED = "is one of the server's own /run_code sandboxes, not an environment of yours"


def fresh_trajectory() -> str:
    return f"{TRAJECTORY_PREFIX}{uuid.uuid4().hex[:12]}"


class WarmPool:
    """Up to `size` open, never-used environments of `memory_mb` on `tg` (a `Tangram`)."""

    def __init__(self, tg: Any, memory_mb: int, size: int, reuse: int = 1) -> None:
        self.tg, self.memory_mb, self.size, self.reuse = tg, memory_mb, size, max(1, reuse)
        # its environments are the CPU manager's records with owner WARM_POOL (their `uses`
        # and `lent` are the pool's); `_ready` queues the warm ones
        self._resetting = 0  # used ones being reset, coming back
        self._waiters: deque[asyncio.Future[str | None]] = deque()  # requests waiting for one
        self._ready: deque[tuple[str, float]] = deque()
        self._refill: asyncio.Task | None = None
        self._again = False  # a refill was asked for while one ran
        self._closing: set[asyncio.Task] = set()
        self.hits = self.misses = self.reused = 0

    async def take(self, memory_mb: int) -> str:
        """A never-used (or reset) environment of `memory_mb`: a warm one when there is one,
        else one being reset (~1 ms) when one is, else one opened now. The caller owns it
        and gives it back with `release`."""
        if memory_mb == self.memory_mb:
            env = self._pop()
            waiting = sum(1 for f in self._waiters if not f.done())
            if env is None and waiting < self._resetting:
                env = await self._next_reset()  # (`_back` marks it lent)
            elif env is not None:
                self._lend(env)
            if (len(self._ready) + self._coming()) * 2 < self.size:
                self._start_refill()  # draining faster than resets bring them back: start now
            if env is not None:
                self.hits += 1
                return env
            self.misses += 1
        env = await self._open_for(memory_mb)
        if memory_mb == self.memory_mb:
            self._lend(env)
        return env

    async def _next_reset(self) -> str | None:
        """The next environment a reset brings back; None when that reset failed or takes
        longer than `RESET_WAIT_S` (a request may have left a tree that takes seconds to
        remove: the next request opens its own rather than wait for it)."""
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await asyncio.wait_for(fut, RESET_WAIT_S)  # cancelled: `_back` skips it
        except TimeoutError:
            return None

    async def _open_for(self, memory_mb: int) -> str:
        while True:
            try:
                env = await self.tg.open_env(fresh_trajectory(), memory_mb)
                return self._opened(env, memory_mb)
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

    def _record(self, env: str) -> EnvRecord | None:
        return self.tg.cpu.envs.record(env)

    def _mine(self) -> list[EnvRecord]:
        return [r for r in self.tg.cpu.envs.records() if r.owner == WARM_POOL]

    def _lend(self, env: str) -> None:
        record = self._record(env)
        if record is not None:
            record.lent = True

    def _opened(self, env: str, memory_mb: int) -> str:
        record = self._record(env)
        assert record is not None
        record.owner = WARM_POOL
        record.uses = 0 if memory_mb == self.memory_mb else None
        return env

    async def _close(self, env: str) -> None:
        with contextlib.suppress(TangramError):
            await self.tg.close_env(env)

    def release(self, env: str) -> None:
        """Reset a used environment back into the pool, or close it and refill, after its
        response is sent: off the request's path (the next request waits for neither). It is
        kept while the pool wants it: fewer ready than its size or than the requests holding
        one now (so a burst keeps the sandboxes it opened), or a request waiting; the choice
        is made here, at once, so a `take` right after knows one is coming back."""
        record = self._record(env)
        uses = None if record is None else record.uses
        if record is not None:
            record.lent = False
        lent = sum(r.lent for r in self._mine())
        wanted = len(self._ready) < max(self.size, lent) or self._waiters
        if uses is not None and uses + 1 < self.reuse and wanted:
            self._resetting += 1
            task = asyncio.ensure_future(self._reset(env, uses))
        else:
            task = asyncio.ensure_future(self._retire(env))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _reset(self, env: str, uses: int) -> None:
        try:
            why = await self.tg.reset_env(env)
        except TangramError as exc:
            why = str(exc)
        finally:
            self._resetting -= 1
        record = self._record(env)
        if why is None and record is not None:
            record.uses = uses + 1
            self.reused += 1
            self._back(env)
            return
        log.debug("warm pool: %s not reused (%s)", env, why)
        self._back(None)
        await self._retire(env)

    async def _retire(self, env: str) -> None:
        await self._close(env)
        self._start_refill()

    def _coming(self) -> int:
        """Environments that will come back to the pool: being reset, or held by a request
        and reusable once more."""
        held = sum(
            1 for r in self._mine() if r.lent and r.uses is not None and r.uses + 1 < self.reuse
        )
        return self._resetting + held

    def _back(self, env: str | None) -> None:
        """Hand a reset environment to a waiting request, else to the pool; a failed reset
        (None) sends a waiting request to open its own."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                if env is not None:
                    self._lend(env)
                fut.set_result(env)
                return
        if env is not None:
            self._ready.append((env, time.monotonic()))

    def discard(self, env: str) -> None:
        """Forget an environment its user closed itself (its record went with it)."""
        self._ready = deque((e, t) for e, t in self._ready if e != env)

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
            while len(self._ready) + self._coming() < self.size:
                wanted = self.size - len(self._ready) - self._coming()
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
        self._ready.append((self._opened(env, self.memory_mb), time.monotonic()))
        return True

    @property
    def mine(self) -> frozenset[str]:
        """The ids of the environments the pool holds now: warm, lent or being reset."""
        return frozenset(r.id for r in self._mine())

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


def warm_pool(tg: Any, memory_mb: int) -> WarmPool | None:
    """The pool of `tg` (created on first use, kept in its `adapters`), or None when it is
    turned off."""
    pool = tg.adapters.get(WARM_POOL)
    if pool is None:
        size = int(os.environ.get("TANGRAM_SANDBOXFUSION_WARM", DEFAULT_SIZE))
        if size <= 0:
            return None
        reuse = int(os.environ.get("TANGRAM_SANDBOXFUSION_REUSE", DEFAULT_REUSE))
        pool = tg.adapters[WARM_POOL] = WarmPool(tg, memory_mb, size, reuse)
    return pool


def pooled(tg: Any, env_id: str) -> bool:
    """Whether `env_id` is one of the `/run_code` pool's environments (the server's own)."""
    record = None if tg.cpu is None else tg.cpu.envs.record(env_id)
    return record is not None and record.owner == WARM_POOL
