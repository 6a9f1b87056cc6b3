"""The scheduler sharded over processes: one shard per group of nodes (docs/scale.md, "Shards").

`ShardedScheduler` (`router`) answers what `tangram.scheduler.Scheduler` answers (`submit`,
`enqueue`, `cancel`, `decide`, `complete`, `bind`, `unbind`, `validate`), so the simulator and
the runtime drive it unchanged. Behind it:

- **Node shards** (`worker`), each a scoped `Scheduler` over its nodes' slice of the core
  pools: their queue classes, their core state, their running actions, in a worker process of
  its own (forked, a pipe each: `handles.ProcessShard`) or, on the Ray backend, a Ray actor
  (`actors.RayShard`). A decision on a node is made in its shard, with the inputs the single
  scheduler would have used for that node: the node's queue, its running actions, and the
  learned per-kind durations, which the router mirrors to every shard before it decides
  (`means`).
- **The global shard**: a `Scheduler` in the router's process over the pooled resources (GPU
  chunks, API limits), beside the GPU manager's residency model its decisions consult.
- **The router** (`router`) routes an action by its trajectory's bound node
  (`tangram.sharding.ShardLayout`), binds a trajectory's first CPU action to the node the pool
  would place it on (`pending`: most free cores, first in order), and keeps a mirror of every
  core pool (each grant taken, each completion released, so a shard that grants a taken core
  is caught). Messages cross as `wire` pickles.
- **Batches** (`batches`, `ShardedScheduler(batched=True)`, for the simulator's event loop):
  the router only notes each instant's work per shard and sends it many instants at a time;
  the shard replays them, deciding exactly where it would have been asked, with the means of
  each instant, and the simulator collects the grants before any event they could precede.

Each shard is the scheduler itself over its nodes, deciding on every event that touches them,
so its liveness and work-conservation rules hold per shard (docs/scale.md says what holds
across shards). A shard that dies loses no queued action: the router holds a copy of every
queued and running action, starts a replacement built from the mirror (running actions
adopted, queued ones resubmitted in their order) and asks it again; after `max_restarts`
failures of one shard its queued actions fail with `ShardLost` naming it. Worker processes die
with the router (`PR_SET_PDEATHSIG`), even when it is killed.
"""

from tangram.runtime.shards.router import BACKENDS, PENDING, ShardedScheduler
from tangram.runtime.shards.takeover import take_over
from tangram.runtime.shards.views import QueueView, ShardLost
from tangram.runtime.shards.wire import wire_dumps, wire_loads
from tangram.runtime.shards.worker import MirroredProfiles, die_with_parent, process_cpu_s

__all__ = [
    "BACKENDS",
    "PENDING",
    "MirroredProfiles",
    "QueueView",
    "ShardLost",
    "ShardedScheduler",
    "die_with_parent",
    "process_cpu_s",
    "take_over",
    "wire_dumps",
    "wire_loads",
]
