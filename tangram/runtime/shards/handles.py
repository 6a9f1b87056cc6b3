"""Where a node shard runs: a forked worker process with a pipe (`ProcessShard`, locally) or a
Ray actor (`tangram.runtime.shards.actors.RayShard`, on the Ray backend). The router talks to
either through the same handle: `send` a message, `recv` its answer (EOFError when the shard
died), `cpu_s` its own CPU seconds, `stop` (ask), `reap` (make sure it is gone)."""

from __future__ import annotations

import gc
import multiprocessing
import os
from dataclasses import dataclass
from typing import Any, Protocol

from tangram.runtime.shards.wire import STOP, wire_dumps
from tangram.runtime.shards.worker import ShardInit, process_cpu_s, shard_main


class ShardHandle(Protocol):
    index: int
    nodes: tuple[str, ...]

    @property
    def pid(self) -> int | None: ...

    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes: ...

    def cpu_s(self) -> float: ...

    def stop(self) -> None: ...

    def reap(self, timeout: float = 1.0) -> int | str | None: ...


@dataclass
class ProcessShard:
    """A node shard in a process forked from the router (it dies with it: PR_SET_PDEATHSIG)."""

    index: int
    nodes: tuple[str, ...]
    process: Any
    conn: Any

    @classmethod
    def start(
        cls, index: int, nodes: tuple[str, ...], init: ShardInit, others: list[ShardHandle]
    ) -> ProcessShard:
        ctx = multiprocessing.get_context("fork")
        ours, theirs = ctx.Pipe()
        inherited = [s.conn for s in others if isinstance(s, ProcessShard)]
        p = ctx.Process(
            target=shard_main,
            name=f"tangram-shard-{index}",
            daemon=True,
            args=(theirs, os.getpid(), inherited, init),
        )
        gc.freeze()  # the child's collector leaves the router's heap alone (no copy on write)
        try:
            p.start()
        finally:
            gc.unfreeze()
        theirs.close()
        return cls(index, nodes, p, ours)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def recv(self) -> bytes:
        return self.conn.recv_bytes()

    def cpu_s(self) -> float:
        """Its own CPU seconds so far, read from /proc (0 once it is gone)."""
        try:
            return process_cpu_s(self.process.pid)
        except (OSError, IndexError):
            return 0.0

    def stop(self) -> None:
        """Ask it to stop (it answers and exits); `reap` waits for it."""
        try:
            self.send(wire_dumps((STOP,)))
        except OSError:
            pass

    def reap(self, timeout: float = 1.0) -> int | None:
        """Make sure it is gone (killed if it has not exited within `timeout` s) and close its
        pipe: its exit code."""
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
        return self.process.exitcode
