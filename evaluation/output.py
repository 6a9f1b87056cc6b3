"""What long commands show while they run and how they print their tables.

- `Steps`: progress over a known number of steps. On a terminal a rich bar (description, bar,
  done/total, elapsed); elsewhere (a pipe, a CI log) one line per finished step on stderr,
  `[label] 3/8 fig6 coding: kubernetes (12.3 s)`, so a long run is never silent and its log
  reads without control characters.
- `show_table`: a table that fits the terminal (rich folds the cells to its width), or, when
  stdout is not a terminal, the same rows as CSV (title as a `#` line first), which no width cuts.
"""

from __future__ import annotations

import csv
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO


class Steps:
    """`with Steps(total, "label") as s: ... s.advance("what finished")`."""

    def __init__(
        self, total: int, label: str, *, quiet: bool = False, stream: TextIO | None = None
    ) -> None:
        self.total, self.label, self.quiet = total, label, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()

    @property
    def on_terminal(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def __enter__(self) -> Steps:
        self._t0 = time.perf_counter()
        if not self.quiet and self.on_terminal:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def describe(self, what: str) -> None:
        """Name the step now running (the bar shows it; a log line names it when it ends)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.label}: {what}")

    def advance(self, what: str = "") -> None:
        self.done += 1
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.advance(self._task)
            return
        elapsed = time.perf_counter() - self._t0
        name = f" {what}" if what else ""
        print(
            f"[{self.label}] {self.done}/{self.total}{name} ({elapsed:.1f} s)",
            file=self.stream,
            flush=True,
        )


def show_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    stream: TextIO | None = None,
) -> None:
    """`rows` under `columns`: a rich table on a terminal, CSV otherwise."""
    out = stream if stream is not None else sys.stdout
    if getattr(out, "isatty", lambda: False)():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for c in columns:
            t.add_column(c, overflow="fold")
        for r in rows:
            t.add_row(*(str(v) for v in r))
        Console(file=out).print(t)
        return
    print(f"# {title}", file=out)
    w = csv.writer(out, lineterminator="\n")
    w.writerow(columns)
    w.writerows([[str(v) for v in r] for r in rows])


class Heartbeat:
    """`with Heartbeat("bench sessions"):` a line on stderr every `every_s` seconds while the
    body runs, `[bench sessions] running, 45 s`: a long command that has no steps to count
    (one bench, one real run) still says it is alive, on a terminal and in a log alike."""

    def __init__(self, label: str, every_s: float = 15.0, stream: TextIO | None = None) -> None:
        self.label, self.every_s = label, every_s
        self.stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.beats = 0

    def _beat(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.wait(self.every_s):
            self.beats += 1
            print(
                f"[{self.label}] running, {time.perf_counter() - t0:.0f} s",
                file=self.stream,
                flush=True,
            )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
