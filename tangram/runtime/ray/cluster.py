"""Building a `Tangram` over Ray (`build_ray`, behind `Tangram.ray`) and the clusters for demos
and tests: `local_cluster` (N nodes on this machine) and `ray_session` (`local:N[xC]`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tangram.errors import BackendUnavailable, ValidationError
from tangram.runtime.config import DEFAULT_POLICY, Components, build_apis, build_gpu, check_policy
from tangram.runtime.ray.agent import sleep_seconds
from tangram.runtime.ray.cpu import RayCpuManager
from tangram.runtime.ray.gpu import build_ray_gpu
from tangram.runtime.ray.remote import MiB, import_ray
from tangram.validation import pos_num


def build_ray(
    address: str | None = None,
    *,
    cpu_backend: str = "auto",
    backend_options: Mapping[str, Any] | None = None,
    poll_s: float = 1.0,
    services: Mapping[str, Any] | None = None,
    apis: Mapping[str, Any] | None = None,
    gpu: Mapping[str, Any] | None = None,
    policy: str = DEFAULT_POLICY,
    policy_options: Mapping[str, Any] | None = None,
    idle_env_s: float | None = None,
    gpu_backend: str | None = None,
    gpu_options: Mapping[str, Any] | None = None,
    gpus_per_node: int | None = None,
) -> Components:
    """`Tangram.ray(...)`: the CPU pool over the cluster's agents. With `gpu_backend`, the GPU
    pool too: each agent runs that backend on its machine's GPUs (`gpus_per_node` for `sim`)
    and the central GPU manager places chunks and keeps residency. Without it, the GPU pool is
    central and simulated, as in `Tangram.local()`. APIs are called from the driver."""
    check_policy(policy, dict(policy_options or {}))
    idle = None if idle_env_s is None else pos_num("idle_env_s", idle_env_s)
    if cpu_backend == "sim" and backend_options is None:
        backend_options = {"duration": sleep_seconds, "time_scale": 1.0}
    cpu = RayCpuManager.connect(
        address,
        backend=cpu_backend,
        backend_options=backend_options,
        poll_s=poll_s,
        gpu_backend=gpu_backend,
        gpu_options=gpu_options,
        gpus_per_node=gpus_per_node,
    )
    try:
        gpu_spec = {**dict(gpu or {}), "services": dict(services or {})}
        gpu_manager = build_ray_gpu(cpu, gpu_spec) if gpu_backend else None
        if gpu_backend and gpu_manager is None:
            raise BackendUnavailable(
                f"gpu_backend={gpu_backend!r}: no Ray node reports a GPU "
                "(set gpus_per_node for the sim backend)"
            )
        return Components(
            cpu=cpu,
            gpu=gpu_manager or build_gpu("gpu", gpu_spec),
            apis=build_apis("apis", apis),
            policy=policy,
            policy_options=dict(policy_options or {}),
            idle_env_s=idle,
        )
    except BaseException:
        asyncio.run(cpu.close()) if not _loop_running() else None
        raise


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@contextlib.contextmanager
def local_cluster(
    nodes: int = 3,
    cpus_per_node: int | Sequence[int] = 2,
    object_store_mb: int = 100,
    health_check_ms: int = 500,
) -> Iterator[Any]:
    """An N-node Ray cluster on this machine (a CPU-less head plus N worker nodes of
    `cpus_per_node` logical CPUs each, or one count per node), connected; shut down on exit.
    Small by default: 100 MB object store per node, no dashboard."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = import_ray()
    from ray.cluster_utils import Cluster

    store = object_store_mb * MiB
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": store,
            "include_dashboard": False,
            "_system_config": {
                "health_check_period_ms": health_check_ms,
                "health_check_failure_threshold": 3,
            },
        },
    )
    try:
        cpus = [cpus_per_node] * nodes if isinstance(cpus_per_node, int) else cpus_per_node
        for c in cpus:
            cluster.add_node(num_cpus=c, object_store_memory=store)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """For `tangram demo --ray ADDRESS` and `tangram serve --ray ADDRESS`: `local:N[xC]` starts
    an N-node local cluster of C cores each (default 2) and yields its address with
    `{"cpu_backend": "sim"}`; any other address is yielded as it is, with no options."""
    if address and address.startswith("local:"):
        spec = address.removeprefix("local:")
        n, _, c = spec.partition("x")
        try:
            nodes, cores = int(n or 3), int(c or 2)
        except ValueError:
            raise ValidationError("ray", address, "local cluster is local:N or local:NxC") from None
        with local_cluster(nodes, cores) as cluster:
            yield cluster.address, {"cpu_backend": "sim"}
    else:
        yield address, {}
