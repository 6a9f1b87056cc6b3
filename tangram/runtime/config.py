"""What a `Tangram` is built from: the embedded default (`build_local`) and YAML configs
(`load_config`), as `Components` (managers, policy) that the facade assembles.

```yaml
policy: {name: backfill-srpt, depth: 2} # the default; heuristic is the paper's algorithm
idle_env_s: 600                          # reclaim environments idle this long (optional)
cpu: {backend: auto}                     # auto | bwrap | cgroup | docker | affinity | sim
                                         # (bwrap/docker options under options:)
gpu:
  backend: torch                         # sim | torch | http (backend options under options:);
                                         # default: torch on the GPUs NVML finds, else sim
  nodes: 1                               # nodes, gpus_per_node, memory_gb: default from
  gpus_per_node: 8                       # discovery (count, memory, NVLink groups), else
  memory_gb: 80                          # 1 x 8 x 80 GB simulated; per GPU
  services:
    judge: {memory_gb: 16, dops: [1, 2], infer_s: {1: 0.4, 2: 0.25}, restore_s: 0.5,
            model: {dim: 64, layers: 2}} # model: what the torch backend runs (TinyLM sizes)
apis:
  search: {url: "http://127.0.0.1:9000/search", method: POST, concurrency: 4,
           quota: 20, period_s: 1.0, timeout_s: 10, retries: 2,
           learn: true}                  # learn the real limit from 429s (the default)
```
Every error names the path of the bad key, e.g. `gpu.services.judge.dops`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from managers.api import ApiConfig, ApiManager
from managers.base import EnvironmentManager, Manager
from managers.basic import Limits
from managers.cpu import CpuManager
from managers.cpu.backends import select
from managers.gpu import GB, GpuManager, Residency, Service, ServiceRegistry, create_backend
from managers.gpu.discovery import inventory_from
from solvers import get_allocator
from tangram.errors import ValidationError
from tangram.pools import ChunkPool
from tangram.validation import integer, mapping, pos_int, pos_num, power_of_two, read_document
from topology import ChunkTree, GpuDiscovery, discover_gpus

log = logging.getLogger("tangram")
# The runtime's policy: the paper's heuristic with conservative backfilling and shortest
# estimated work first (with aging). It beats `heuristic` on the exact-gap study (batch mean
# gap 7% against 16%) and in the paper's AI-coding experiments; `heuristic` stays selectable.
DEFAULT_POLICY = "backfill-srpt"


def build_services(path: str, spec: Any) -> ServiceRegistry:
    registry = ServiceRegistry()
    for name, s in mapping(path, spec, set(spec or {})).items():
        sp = f"{path}.{name}"
        s = mapping(sp, s, {"memory_gb", "dops", "infer_s", "restore_s", "model"})
        if "memory_gb" not in s:
            raise ValidationError(f"{sp}.memory_gb", None, "is required")
        mem = int(pos_num(f"{sp}.memory_gb", s["memory_gb"]) * GB)
        dops = s.get("dops", [1])
        if not isinstance(dops, list) or not dops:
            raise ValidationError(f"{sp}.dops", dops, "must be a list of GPU counts")
        dops = tuple(pos_int(f"{sp}.dops", d) for d in dops)
        infer = {int(k): pos_num(f"{sp}.infer_s.{k}", v)
                 for k, v in mapping(f"{sp}.infer_s", s.get("infer_s"),
                                      {*dops, *map(str, dops)}).items()}
        restore = s.get("restore_s")
        try:
            registry.register(Service(name, {k: mem for k in dops},
                                      {k: pos_num(f"{sp}.restore_s", restore, True)
                                       for k in dops} if restore is not None else {},
                                      infer))
        except ValidationError as exc:
            raise ValidationError(f"{sp}.{exc.field.split('.')[-1]}", exc.value,
                                  exc.problem) from None
    return registry


def build_gpu(path: str, spec: Mapping[str, Any] | None,
              discover: Callable[[], GpuDiscovery] = discover_gpus) -> GpuManager:
    """The GPU pool and backend. Without `backend`: `torch` on the GPUs NVML finds (`discover`),
    the pool sized from them (count, memory, NVLink groups: `managers.gpu.discovery`), else
    `sim` on a simulated pool, said at WARNING and in `/v1/status` (`gpu_simulated`). `nodes`,
    `gpus_per_node` and `memory_gb` size the pool instead of discovery when given."""
    spec = mapping(path, spec, {"backend", "nodes", "gpus_per_node", "memory_gb", "services",
                                 "options"})
    found = discover()
    inventory = inventory_from(found, "gpu0")
    backend = spec.get("backend")
    if backend is None:
        backend = "sim" if inventory.empty else "torch"
    sized = any(k in spec for k in ("nodes", "gpus_per_node", "memory_gb"))
    registry = build_services(f"{path}.services", spec.get("services"))
    if inventory.empty or sized:
        nodes = pos_int(f"{path}.nodes", spec.get("nodes", 1))
        per_node = power_of_two(f"{path}.gpus_per_node", spec.get("gpus_per_node", 8))
        mem = int(pos_num(f"{path}.memory_gb", spec.get("memory_gb", 80)) * GB)
        trees = {f"gpu{i}": ChunkTree(per_node, f"gpu{i}") for i in range(nodes)}
        memory = {n: [mem] * per_node for n in trees}
        origin = (f"configured: {nodes} x {per_node} GPUs of {mem / GB:g} GB" if sized else
                  f"default: {nodes} x {per_node} GPUs of {mem / GB:g} GB")
    else:
        trees, memory = dict(inventory.trees), dict(inventory.memory)
        origin = (f"discovered (NVML): {len(found.gpus)} GPUs, pool of "
                  f"{inventory.trees['gpu0'].num_gpus} ({min(inventory.memory['gpu0']) / GB:.0f}"
                  f" GB each){'; ' + '; '.join(inventory.notes) if inventory.notes else ''}")
    if backend == "sim":
        why = (f"no GPU ({inventory.reason})" if inventory.empty else
               f"gpu.backend is sim although NVML found {len(found.gpus)} GPUs")
        origin = f"SIMULATED GPU pool, {why}; {origin}"
        log.warning("gpu: %s: calls return modelled times, no model runs", origin)
    else:
        log.info("gpu: %s backend; %s", backend, origin)
    try:
        residency = Residency(memory, registry)
    except ValidationError as exc:
        raise ValidationError(f"{path}.services", exc.value, exc.problem) from None
    options = dict(mapping(f"{path}.options", spec.get("options"),
                           set(spec.get("options") or {})))
    if backend == "torch" and "models" not in options:
        options["models"] = torch_models(f"{path}.services", spec.get("services"))
    manager = GpuManager(ChunkPool("gpu", trees), residency, create_backend(backend, **options))
    manager.origin = origin
    return manager


def torch_models(path: str, spec: Any) -> dict[str, Any]:
    """Each service's `model` (TinyLM sizes) for the torch backend, which runs one per service."""
    models = {}
    for name, s in (spec or {}).items():
        if not isinstance(s, Mapping) or s.get("model") is None:
            raise ValidationError(f"{path}.{name}.model", None,
                                  "the torch backend runs a model per service: give its TinyLM "
                                  "sizes (model: {dim: 64, layers: 2}), or set gpu.backend: "
                                  "http (an inference server) or sim")
        models[name] = mapping(f"{path}.{name}.model", s["model"], set(s["model"]))
    return models


API_KEYS = {"url", "method", "headers", "concurrency", "quota", "period_s", "timeout_s",
            "retries", "backoff_s", "learn"}


def build_apis(path: str, spec: Any) -> dict[str, Manager]:
    """One `ApiManager` serving every configured API; returns {name: manager}."""
    if not spec:
        return {}
    configs = []
    for name, s in mapping(path, spec, set(spec)).items():
        sp = f"{path}.{name}"
        s = mapping(sp, s, API_KEYS)
        if "url" not in s:
            raise ValidationError(f"{sp}.url", None, "is required")
        try:
            limits = Limits(s.get("concurrency"), s.get("quota"), s.get("period_s", 1.0))
            configs.append(ApiConfig(
                str(name), s["url"], limits, s.get("method", "POST"), s.get("headers") or {},
                s.get("timeout_s", 30.0), s.get("retries", 0), s.get("backoff_s", 0.1),
                s.get("learn", True)))
        except ValidationError as exc:
            field = exc.field.split(".")[-1].removeprefix(f"api[{name}]")
            raise ValidationError(f"{sp}.{field or 'limits'}", exc.value, exc.problem) from None
    manager = ApiManager(configs)
    return {c.name: manager for c in configs}


def build_cpu(path: str, spec: Mapping[str, Any] | None) -> CpuManager:
    """`backend` (auto | bwrap | cgroup | docker | affinity | sim) and its `options` (e.g.
    `pids_max`, `uid_base`, `ro_paths` of bwrap; `image` of docker); `state_dir`, `disk_mb`
    (the default disk bound of an environment with an image) and `disk_capacity_mb` (the
    node's disk for environments) of the CPU manager."""
    spec = mapping(path, spec, {"backend", "options", "state_dir", "disk_mb",
                                "disk_capacity_mb"})
    options = mapping(f"{path}.options", spec.get("options"))
    layers = {k: spec[k] for k in ("state_dir", "disk_mb", "disk_capacity_mb") if k in spec}
    try:
        return CpuManager(select(spec.get("backend", "auto"), **options), **layers)
    except TypeError as exc:  # an option the backend does not take
        raise ValidationError(f"{path}.options", options, f"not options of the backend ({exc})"
                              ) from None


@dataclass(frozen=True)
class Components:
    """What a `Tangram` is made of; `Tangram(**components.kwargs())` assembles it."""

    cpu: EnvironmentManager | None = None
    gpu: GpuManager | None = None
    apis: Mapping[str, Manager] = field(default_factory=dict)
    policy: str = DEFAULT_POLICY
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    idle_env_s: float | None = None
    shards: int = 0  # node-shard processes of the scheduler (0: one process; docs/scale.md)

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_policy(policy: str, options: Mapping[str, Any]) -> None:
    """Fail at load, naming `policy.<option>`, for an unknown policy or option."""
    try:
        get_allocator(policy, **options)
    except ValidationError as exc:
        raise ValidationError("policy" + exc.field.removeprefix("allocator"), exc.value,
                              exc.problem) from None


def build(doc: Mapping[str, Any],
          discover: Callable[[], GpuDiscovery] = discover_gpus) -> Components:
    doc = mapping("config", doc, {"policy", "cpu", "gpu", "apis", "idle_env_s", "shards"})
    policy = doc.get("policy", DEFAULT_POLICY)
    options: dict[str, Any] = {}
    if isinstance(policy, dict):
        options = dict(policy)
        policy = options.pop("name", DEFAULT_POLICY)
    if not isinstance(policy, str):
        raise ValidationError("policy", policy, "must be a policy name or {name: ..., options}")
    check_policy(policy, options)
    idle = doc.get("idle_env_s")
    cpu = build_cpu("cpu", doc.get("cpu")) if doc.get("cpu", {}) is not False else None
    gpu = build_gpu("gpu", doc["gpu"], discover) if doc.get("gpu") else None
    apis = build_apis("apis", doc.get("apis"))
    return Components(cpu=cpu, gpu=gpu, apis=apis, policy=policy, policy_options=options,
                      idle_env_s=None if idle is None else pos_num("idle_env_s", idle),
                      shards=integer("shards", doc.get("shards", 0), minimum=0))


def load_config(path: str | Path) -> Components:
    doc = read_document(path, "config", yaml.safe_load, yaml.YAMLError, "YAML")
    return build(doc or {})


def build_local(cpu_backend: str = "auto", services: Mapping[str, Any] | None = None,
                apis: Mapping[str, Any] | None = None, policy: str = DEFAULT_POLICY,
                policy_options: Mapping[str, Any] | None = None,
                idle_env_s: float | None = None,
                gpu: Mapping[str, Any] | None = None,
                discover: Callable[[], GpuDiscovery] = discover_gpus,
                shards: int = 0) -> Components:
    """The embedded default: this machine's cores, a GPU pool (the GPUs `discover` finds on
    the torch backend; simulated, with a warning, when there is none), the given services and
    APIs. Nothing to start."""
    doc: dict[str, Any] = {"policy": {"name": policy, **dict(policy_options or {})},
                           "cpu": {"backend": cpu_backend},
                           "gpu": {**dict(gpu or {}), "services": dict(services or {})}}
    if apis:
        doc["apis"] = dict(apis)
    if idle_env_s is not None:
        doc["idle_env_s"] = idle_env_s
    if shards:
        doc["shards"] = shards
    return build(doc, discover)
