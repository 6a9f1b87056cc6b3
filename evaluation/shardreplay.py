"""What a node shard's work costs live and what the same work costs replayed: where the sharded
scheduler's total goes (docs/scale.md, "Where the shards' CPU goes").

    python -m evaluation.shardreplay --batch 16384 --nodes-per-shard 16

One `tangram bench scale` run of the sharded layout (AI coding, window 60-90 simulated s) in
which every node shard records each message it is sent and each answer; then each shard is built
again from its start (the `ShardInit` it was started from, wire-pickled) and the messages are
replayed to it in this process, one shard after the other, its CPU read around the replay. Every
answer must equal the one recorded (the replay is the same work, decision for decision). Beside
it, the same window through the one process (`heuristic/scoped`) in the same invocation: the
same-run reference. Printed: per shard the live CPU (the bench's figure, its process over the
window) and the replayed CPU, and their totals per simulated second.

    python -m evaluation.shardreplay --lockstep none walk sleep

replays the recorded shards again, each in a process of its own, in lockstep as the router
drives them (each batch sent to every shard, then every answer read), with this process doing
nothing between two batches (`none`), walking 200,000 objects of a 3,000,000-object list as a
simulation would (`walk`), or sleeping 10 ms (`sleep`): the shards' total CPU per simulated
second under each (docs/scale.md, "Where the shards' CPU goes").

    python -m evaluation.shardreplay --nap 0 0.005 --stretch 4

It also replays the shards interleaved, batch by batch in this process (each shard's k-th
message, then each one's k+1-th, as they take turns live, with no process switch and no
pause). `--nap` replays each shard in this process once more per value, sleeping that long before
each message (what a pause alone costs the work after it); `--stretch F` records a run whose
engine collects the shards' grants F times later than its exact bound (batches about F times
as long, so F times fewer messages; a diagnostic of what the message count costs: a grant may
then end before events already handled, so that run's schedule is not exact, though its replay
must still answer as recorded).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

from evaluation.benches import scale_run
from evaluation.engine import Engine
from tangram.runtime.shards import handles
from tangram.runtime.shards.wire import wire_dumps, wire_loads
from tangram.runtime.shards.worker import ShardWorker, settle_collector, shard_main


class _Recording:
    """A shard's pipe end that keeps every message in and every answer out."""

    def __init__(self, conn) -> None:
        self.conn, self.seen, self.said = conn, [], []

    def recv_bytes(self) -> bytes:
        data = self.conn.recv_bytes()
        self.seen.append(data)
        return data

    def send_bytes(self, data: bytes) -> None:
        self.conn.send_bytes(data)
        self.said.append(data)

    def close(self) -> None:
        self.conn.close()


def _recording_main(folder: str):
    def main(conn, parent: int, inherited: list, init) -> None:
        rec = _Recording(conn)
        start = wire_dumps(init)
        try:
            shard_main(rec, parent, inherited, init)
        finally:
            with open(Path(folder) / f"shard-{os.getpid()}.pkl", "wb") as f:
                pickle.dump((start, rec.seen, rec.said), f)

    return main


def _rebuilt(path: Path | str) -> tuple[ShardWorker, list[bytes], list[bytes]]:
    """A recorded shard built again from its start, with its collector as a shard's, and the
    messages it was sent and its answers."""
    with open(path, "rb") as f:
        start, seen, said = pickle.load(f)
    worker = ShardWorker(wire_loads(start))
    settle_collector()
    return worker, seen, said


@contextlib.contextmanager
def _collector_kept():
    """Set this process's collector back as it was (a rebuilt shard's settings change it)."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def _check(label: str, got: list[bytes], said: list[bytes]) -> None:
    for k, (a, b) in enumerate(zip(got, said, strict=True)):
        if wire_loads(a) != wire_loads(b):
            raise AssertionError(f"{label}: answer {k} differs from the recorded one")


def replay(path: Path, nap: float = 0.0) -> tuple[float, int, int]:
    """(CPU seconds, messages, cyclic objects a full collection finds after it) of replaying
    one recorded shard in this process (its collector set back after), sleeping `nap` seconds
    before each message; raises when an answer differs from the one recorded."""
    with _collector_kept():
        worker, seen, said = _rebuilt(path)
        answers = []
        c0 = time.process_time()
        for data in seen:
            if nap:
                time.sleep(nap)
            answers.append(worker.handle(data)[0])
        cpu = time.process_time() - c0
        cyclic = gc.collect()  # what a shard's collector would ever have to find
    _check(path.name, answers, said)
    return cpu, len(seen), cyclic


def interleaved(paths: list[Path]) -> float:
    """CPU seconds of replaying every recorded shard in this process batch by batch (each
    shard's k-th message, then each shard's k+1-th), as the shards take turns live but with no
    process switch and no pause: what the shards' data competing for the caches costs alone.
    Raises when an answer differs from the one recorded."""
    with _collector_kept():
        shards = [_rebuilt(path) for path in paths]
        answers: list[list[bytes]] = [[] for _ in shards]
        c0 = time.process_time()
        for k in range(max(len(seen) for _, seen, _ in shards)):
            for (worker, seen, _), got in zip(shards, answers):
                if k < len(seen):
                    got.append(worker.handle(seen[k])[0])
        cpu = time.process_time() - c0
    for path, (_, _, said), got in zip(paths, shards, answers):
        _check(f"{path.name} (interleaved)", got, said)
    return cpu


def _lockstep_child(conn, path: str) -> None:
    worker, _, _ = _rebuilt(path)
    conn.send_bytes(b"ready")
    c0 = time.process_time()
    while (data := conn.recv_bytes()) != b"end":
        conn.send_bytes(worker.handle(data)[0])
    conn.send_bytes(repr(time.process_time() - c0).encode())


def lockstep(paths: list[Path], between: str) -> float:
    """The shards' total CPU seconds replaying `paths` in lockstep, this process doing
    `between` (none, walk, sleep) between two batches."""
    seen = []
    for path in paths:
        with open(path, "rb") as f:
            seen.append(pickle.load(f)[1])
    heap = [(i, str(i)) for i in range(3_000_000)] if between == "walk" else []
    ctx = multiprocessing.get_context("fork")
    kids = []
    for path in paths:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=_lockstep_child, args=(theirs, str(path)), daemon=True)
        p.start()
        ours.recv_bytes()
        kids.append((ours, p))
    for k in range(max(map(len, seen))):
        asked = [(c, msgs[k]) for (c, _), msgs in zip(kids, seen) if k < len(msgs)]
        for c, data in asked:
            c.send_bytes(data)
        for c, _ in asked:
            c.recv_bytes()
        if between == "walk":
            at = (k * 7919) % len(heap)
            sum(x for x, _ in heap[at : at + 200_000])
        elif between == "sleep":
            time.sleep(0.01)
    total = 0.0
    for c, p in kids:
        c.send_bytes(b"end")
        total += float(c.recv_bytes())
        p.join()
    return total


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--nodes-per-shard", type=int, default=16)
    p.add_argument("--warmup", type=float, default=60.0)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument(
        "--lockstep",
        nargs="*",
        choices=("none", "walk", "sleep"),
        default=(),
        help="replay the shards in lockstep too, with this between two batches",
    )
    p.add_argument(
        "--nap",
        nargs="*",
        type=float,
        default=(),
        help="replay each shard in this process again, sleeping this long before each message",
    )
    p.add_argument(
        "--stretch",
        type=float,
        default=1.0,
        help="collect the shards' grants this many times later than the exact bound "
        "(longer batches; a diagnostic: the schedule is then not exact)",
    )
    ns = p.parse_args(argv)
    if not ns.stretch >= 1.0:
        p.error(f"--stretch must be at least 1 (got {ns.stretch})")
    if any(not n >= 0 for n in ns.nap):
        p.error(f"--nap must be at least 0 seconds (got {ns.nap})")
    return ns


def _replays(paths: list[Path], span: float, ns: argparse.Namespace) -> list[float]:
    """Replay the recorded shards every way asked, printing each; each shard's share replayed
    one after the other."""
    offline = []
    for path in paths:
        cpu, n, cyclic = replay(path)
        offline.append(cpu / span)
        print(
            f"  {path.stem}: {n} messages, replayed {cpu / span:.4f}, {cyclic} cyclic objects left",
            flush=True,
        )
    cpu = interleaved(paths)
    print(f"node shards replayed interleaved, batch by batch in this process: {cpu / span:.4f}")
    for nap in ns.nap:
        cpu = sum(replay(path, nap)[0] for path in paths)
        print(
            f"node shards replayed, {nap * 1e3:g} ms asleep before each message: {cpu / span:.4f}"
        )
    for between in ns.lockstep:
        cpu = lockstep(paths, between)
        print(f"node shards in lockstep, {between} between batches: {cpu / span:.4f}")
    return offline


def main(argv: list[str] | None = None) -> int:
    ns = _args(argv)
    job = ("coding", ns.batch, "heuristic/scoped", ns.nodes_per_shard, ns.warmup, ns.window, 6)
    one = scale_run.run_one(job)
    print(f"one process (live): {one.share:.4f} CPU s per simulated s", flush=True)
    with tempfile.TemporaryDirectory(prefix="tangram-shardreplay-") as folder:
        handles.shard_main = _recording_main(folder)
        Engine.collect_stretch = ns.stretch
        try:
            sharded = scale_run.run_one((job[0], job[1], "heuristic/sharded", *job[3:]))
        finally:
            handles.shard_main = shard_main
            Engine.collect_stretch = 1.0
        span = sharded.window[1] - sharded.window[0]
        paths = sorted(Path(folder).glob("shard-*.pkl"), key=lambda q: q.stat().st_mtime)
        offline = _replays(paths, span, ns)
    live = sum(sharded.shard_shares)
    print(
        f"router (live): {sharded.share:.4f}\n"
        f"node shards: live {live:.4f}, replayed {sum(offline):.4f} "
        f"(live / replayed {live / max(sum(offline), 1e-9):.2f}); every answer as recorded\n"
        f"sharded total (live) {sharded.total:.4f} = {sharded.total / one.share:.2f}x the one "
        f"process's"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
