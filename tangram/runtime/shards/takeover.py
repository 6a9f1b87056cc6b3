"""`take_over`: node shards that continue a one-process scheduler's state (its pools as they
are, bindings, learned durations, running actions and queue), as a replacement shard continues
a dead one's. The scale bench warms up in one process and measures the shards from there on
(docs/scale.md, "The window")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tangram.runtime.shards.router import ShardedScheduler
from tangram.runtime.shards.worker import adopt
from tangram.scheduler import Scheduler
from tangram.sharding import GLOBAL


def take_over(
    sched: Scheduler, *, shards: int, kinds: Iterable[str], **options: Any
) -> ShardedScheduler:
    """A `ShardedScheduler` over `sched`'s pools (shared: `sched` is not used after this) that
    holds `sched`'s bindings, profiles, running actions and queue (in its order), each on the
    shard that owns it. `kinds`: every action kind the profiles may have learned (a shard is
    sent the mean of each). Its decision count goes on from `sched`'s."""
    out = ShardedScheduler(
        sched.pools,
        sched.allocator,
        shards=shards,
        profiles=sched.profiles,
        max_queue=sched.max_queue,
        scoped=sched.scoped,
        start=False,
        **options,
    )
    for (t, r), n in sched.bindings.items():
        out._global.bind(t, r, n)
    out._means.kind_at.update((k, 0) for k in kinds)
    for aid, ra in sched.running.items():
        i = out.layout.route(ra.assignment.action, out.bindings)
        if i == GLOBAL:
            adopt(out._global, ra.assignment, ra.start)
        else:
            out._running[i][aid] = ra
        out._where[aid] = i
    for act in list(sched.queue):
        out.enqueue(act)
    out._dirty.update(i for i, q in enumerate(out._queued) if q)
    out.decisions = sched.decisions
    out.start_shards()
    return out
