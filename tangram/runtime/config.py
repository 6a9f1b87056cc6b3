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
The document is checked whole against one schema (`config_schema`, pydantic models) before
anything is built; every error names the path of the bad key, e.g. `gpu.services.judge.dops`.
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
from managers.cpu.backends import BACKENDS, options_of
from managers.gpu import (
    GB,
    GpuBackend,
    GpuManager,
    Residency,
    Service,
    ServiceRegistry,
    create_backend,
)
from managers.gpu.discovery import inventory_from
from solvers import get_allocator
from tangram.errors import BackendUnavailable, ValidationError
from tangram.pools import ChunkPool
from tangram.runtime.config_schema import ApiSpec, ConfigSpec, CpuSpec, GpuSpec, ServiceSpec, parse
from tangram.validation import read_document
from topology import ChunkTree, GpuDiscovery, discover_gpus

log = logging.getLogger("tangram")
# The runtime's policy: the paper's heuristic with conservative backfilling and shortest
# estimated work first (with aging). It beats `heuristic` on the exact-gap study (batch mean
# gap 7% against 16%) and in the paper's AI-coding experiments; `heuristic` stays selectable.
DEFAULT_POLICY = "backfill-srpt"


def build_services(path: str, spec: Any) -> ServiceRegistry:
    """The services of `gpu.services` (a document's mapping, or its parsed specs)."""
    if not isinstance(spec, Mapping) or not all(isinstance(s, ServiceSpec) for s in spec.values()):
        spec = parse(GpuSpec, path.removesuffix(".services"), {"services": spec}).services
    registry = ServiceRegistry()
    for name, s in spec.items():
        sp = f"{path}.{name}"
        mem = int(s.memory_gb * GB)
        restore = {k: s.restore_s for k in s.dops} if s.restore_s is not None else {}
        try:
            registry.register(Service(name, {k: mem for k in s.dops}, restore, dict(s.infer_s)))
        except ValidationError as exc:
            raise ValidationError(
                f"{sp}.{exc.field.split('.')[-1]}", exc.value, exc.problem
            ) from None
    return registry


def build_gpu(
    path: str,
    spec: Mapping[str, Any] | GpuSpec | None,
    discover: Callable[[], GpuDiscovery] = discover_gpus,
) -> GpuManager:
    """The GPU pool and backend. Without `backend`: `torch` on the GPUs NVML finds (`discover`),
    the pool sized from them (count, memory, NVLink groups: `managers.gpu.discovery`), else
    `sim` on a simulated pool, said at WARNING and in `/v1/status` (`gpu_simulated`). `nodes`,
    `gpus_per_node` and `memory_gb` size the pool instead of discovery when given."""
    spec = spec if isinstance(spec, GpuSpec) else parse(GpuSpec, path, spec)
    found = discover()
    inventory = inventory_from(found, "gpu0")
    backend = spec.backend or ("sim" if inventory.empty else "torch")
    sized = spec.given("nodes", "gpus_per_node", "memory_gb")
    registry = build_services(f"{path}.services", spec.services)
    if inventory.empty or sized:
        mem = int(spec.memory_gb * GB)
        trees, memory = uniform_gpus(
            {f"gpu{i}": spec.gpus_per_node for i in range(spec.nodes)}, mem
        )
        origin = (
            f"{'configured' if sized else 'default'}: {spec.nodes} x "
            f"{spec.gpus_per_node} GPUs of {mem / GB:g} GB"
        )
    else:
        trees, memory = dict(inventory.trees), dict(inventory.memory)
        origin = (
            f"discovered (NVML): {len(found.gpus)} GPUs, pool of "
            f"{inventory.trees['gpu0'].num_gpus} ({min(inventory.memory['gpu0']) / GB:.0f}"
            f" GB each){'; ' + '; '.join(inventory.notes) if inventory.notes else ''}"
        )
    if backend == "sim":
        why = (
            f"no GPU ({inventory.reason})"
            if inventory.empty
            else f"gpu.backend is sim although NVML found {len(found.gpus)} GPUs"
        )
        origin = f"SIMULATED GPU pool, {why}; {origin}"
        log.warning("gpu: %s: calls return modelled times, no model runs", origin)
    else:
        log.info("gpu: %s backend; %s", backend, origin)

    def make_backend() -> GpuBackend:  # after the pool and residency are valid
        options = dict(spec.options)
        if backend == "torch" and "models" not in options:
            options["models"] = torch_models(f"{path}.services", spec.services)
        return create_backend(backend, **options)

    manager = gpu_manager(path, trees, memory, registry, make_backend)
    manager.origin = origin
    return manager


def uniform_gpus(
    gpus: Mapping[str, int], memory_b: int
) -> tuple[dict[str, ChunkTree], dict[str, list[int]]]:
    """A chunk tree per node of `gpus[node]` GPUs (a power of two), each GPU `memory_b` bytes."""
    return (
        {n: ChunkTree(g, n) for n, g in gpus.items()},
        {n: [memory_b] * g for n, g in gpus.items()},
    )


def gpu_manager(
    path: str,
    trees: Mapping[str, ChunkTree],
    memory: Mapping[str, list[int]],
    registry: ServiceRegistry,
    backend: Callable[[], GpuBackend],
) -> GpuManager:
    """The one GPU pool builder (local, configured and Ray): the chunk pool of `trees`, the
    residency of `registry`'s services in `memory` (bytes per GPU per node; a service that
    fits no GPU is an error at `path.services`), over the backend `backend` makes (made only
    once the pool is valid)."""
    try:
        residency = Residency(dict(memory), registry)
    except ValidationError as exc:
        raise ValidationError(f"{path}.services", exc.value, exc.problem) from None
    return GpuManager(ChunkPool("gpu", dict(trees)), residency, backend())


def torch_models(path: str, services: Mapping[str, ServiceSpec]) -> dict[str, Any]:
    """Each service's `model` (TinyLM sizes) for the torch backend, which runs one per service."""
    models = {}
    for name, s in services.items():
        if s.model is None:
            raise ValidationError(
                f"{path}.{name}.model",
                None,
                "the torch backend runs a model per service: give its TinyLM "
                "sizes (model: {dim: 64, layers: 2}), or set gpu.backend: "
                "http (an inference server) or sim",
            )
        models[name] = dict(s.model)
    return models


def build_apis(path: str, spec: Any) -> dict[str, Manager]:
    """One `ApiManager` serving every configured API; returns {name: manager}."""
    if not spec:
        return {}
    if not isinstance(spec, Mapping) or not all(isinstance(s, ApiSpec) for s in spec.values()):
        spec = parse(ConfigSpec, "", {"apis": spec}).apis
    configs = []
    for name, s in spec.items():
        try:
            limits = Limits(s.concurrency, s.quota, s.period_s)
            configs.append(
                ApiConfig(
                    str(name),
                    s.url,
                    limits,
                    s.method,
                    dict(s.headers),
                    s.timeout_s,
                    s.retries,
                    s.backoff_s,
                    s.learn,
                )
            )
        except ValidationError as exc:
            key = exc.field.split(".")[-1].removeprefix(f"api[{name}]")
            raise ValidationError(
                f"{path}.{name}.{key or 'limits'}", exc.value, exc.problem
            ) from None
    manager = ApiManager(configs)
    return {c.name: manager for c in configs}


def backend_options(path: str, backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` checked against what the backend's constructor takes (for `auto`: what some
    backend takes; the rule is `managers.cpu.backends.options_of`), so a misspelt option is
    named here with its key path."""
    names = [backend] if backend in BACKENDS else BACKENDS.names()
    takes: set[str] = set()
    for name in names:
        try:
            known = options_of(name)
        except BackendUnavailable:  # its module cannot load here: starting it says why
            continue
        if known is None:
            return dict(options)
        takes |= known
    for key, value in options.items():
        if key not in takes:
            raise ValidationError(
                f"{path}.{key}",
                value,
                f"not an option of the {backend} backend (options: {sorted(takes)})",
            )
    return dict(options)


def build_cpu(path: str, spec: Mapping[str, Any] | CpuSpec | None) -> CpuManager:
    """`backend` (auto | bwrap | cgroup | docker | affinity | sim) and its `options` (e.g.
    `pids_max`, `uid_base`, `ro_paths` of bwrap; `image` of docker); `state_dir`, `disk_mb`
    (the default disk bound of an environment with an image), `disk_capacity_mb` (the
    node's disk for environments), `tar_max_mb` (the bound of one files/tar stream) and
    `background` (a shell session's share of one core between its commands) of the CPU
    manager."""
    spec = spec if isinstance(spec, CpuSpec) else parse(CpuSpec, path, spec)
    options = backend_options(f"{path}.options", spec.backend, spec.options)
    layers = spec.model_dump(
        include={"state_dir", "disk_mb", "disk_capacity_mb", "tar_max_mb", "background"},
        exclude_unset=True,
    )
    return CpuManager(spec.backend, backend_options=options, **layers)


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
        raise ValidationError(
            "policy" + exc.field.removeprefix("allocator"), exc.value, exc.problem
        ) from None


def policy_of(spec: Any) -> tuple[str, dict[str, Any]]:
    """`policy: NAME` or `policy: {name: NAME, <option>: <value>}` as (name, options)."""
    if spec is None:
        return DEFAULT_POLICY, {}
    options: dict[str, Any] = {}
    if isinstance(spec, dict):
        options = dict(spec)
        spec = options.pop("name", DEFAULT_POLICY)
    if not isinstance(spec, str):
        raise ValidationError("policy", spec, "must be a policy name or {name: ..., options}")
    check_policy(spec, options)
    return spec, options


def build(
    doc: Mapping[str, Any], discover: Callable[[], GpuDiscovery] = discover_gpus
) -> Components:
    """A config document (module docstring) checked whole against `config_schema`, then
    built; `cpu: false` means no CPU pool, an absent or empty `gpu` no GPU pool."""
    no_cpu = isinstance(doc, Mapping) and doc.get("cpu") is False
    if no_cpu:
        doc = {k: v for k, v in doc.items() if k != "cpu"}
    spec = parse(ConfigSpec, "", doc)
    policy, options = policy_of(spec.policy)
    cpu = None if no_cpu else build_cpu("cpu", spec.cpu or CpuSpec())
    gpu = build_gpu("gpu", spec.gpu, discover) if doc.get("gpu") else None
    return Components(
        cpu=cpu,
        gpu=gpu,
        apis=build_apis("apis", spec.apis),
        policy=policy,
        policy_options=options,
        idle_env_s=spec.idle_env_s,
        shards=spec.shards,
    )


def load_config(path: str | Path) -> Components:
    doc = read_document(path, "config", yaml.safe_load, yaml.YAMLError, "YAML")
    return build(doc or {})


def build_local(
    cpu_backend: str = "auto",
    services: Mapping[str, Any] | None = None,
    apis: Mapping[str, Any] | None = None,
    policy: str = DEFAULT_POLICY,
    policy_options: Mapping[str, Any] | None = None,
    idle_env_s: float | None = None,
    gpu: Mapping[str, Any] | None = None,
    discover: Callable[[], GpuDiscovery] = discover_gpus,
    shards: int = 0,
) -> Components:
    """The embedded default: this machine's cores, a GPU pool (the GPUs `discover` finds on
    the torch backend; simulated, with a warning, when there is none), the given services and
    APIs. Nothing to start."""
    doc: dict[str, Any] = {
        "policy": {"name": policy, **dict(policy_options or {})},
        "cpu": {"backend": cpu_backend},
        "gpu": {**dict(gpu or {}), "services": dict(services or {})},
    }
    if apis:
        doc["apis"] = dict(apis)
    if idle_env_s is not None:
        doc["idle_env_s"] = idle_env_s
    if shards:
        doc["shards"] = shards
    return build(doc, discover)
