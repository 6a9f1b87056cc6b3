"""Tangram over a Ray cluster: one node agent per machine, the scheduler and its pools central.

```python
tg = Tangram.ray(address="auto", cpu_backend="cgroup")   # or "ray://head:10001", "local:3"
async with tg:
    env = await tg.open_env("traj-1")                      # placed on some node, bound there
    r = await tg.exec(env, "pytest -q", cpu=(1, 8), elastic=True)
    r.placement["cpu"].node                                 # e.g. "n-77f33c71"
```

The Ray layer, one job per module (this package re-exports their public names):

- `agent`: `NodeAgent`, the actor on each machine that owns its CPU and GPU backends.
- `remote`: `RemoteAgent`, the typed client the central managers call an agent through
  (a dead agent is `NodeLost`), and starting an agent pinned to its node.
- `nodes`: membership and faults (the watcher; a lost node and what it takes with it).
- `cpu`: `RayCpuManager`, the `cpu` pool over the agents, its environments in the same
  `EnvironmentTable` (and node choice) as a machine's `CpuManager`.
- `gpu`: `RayGpuBackend` and `build_ray_gpu` (the one GPU pool builder over the agents).
- `cluster`: `build_ray` (`Tangram.ray`), `local_cluster` and `ray_session` (`local:N`).
"""

from tangram.runtime.ray.cluster import build_ray, local_cluster, ray_session
from tangram.runtime.ray.cpu import RayCpuManager
from tangram.runtime.ray.gpu import RayGpuBackend, build_ray_gpu
from tangram.runtime.ray.nodes import RayNode, RayNodes
from tangram.runtime.ray.remote import (
    INSTALL_HINT,
    MiB,
    RemoteAgent,
    import_ray,
    is_actor_death,
    node_name,
)

__all__ = [
    "INSTALL_HINT",
    "RayCpuManager",
    "RayGpuBackend",
    "RayNode",
    "RayNodes",
    "MiB",
    "RemoteAgent",
    "build_ray",
    "build_ray_gpu",
    "import_ray",
    "is_actor_death",
    "local_cluster",
    "node_name",
    "ray_session",
]
