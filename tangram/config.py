"""Building a `Tangram`: the embedded default (`build_local`) and YAML configs (`load_config`).

```yaml
policy: {name: heuristic, depth: 2}     # or just: heuristic
idle_env_s: 600                          # reclaim environments idle this long (optional)
cpu: {backend: auto}                     # auto | cgroup | docker | affinity | sim
gpu:
  backend: sim                           # sim | torch | http (backend options under options:)
  nodes: 1
  gpus_per_node: 8
  memory_gb: 80                          # per GPU
  services:
    judge: {memory_gb: 16, dops: [1, 2], infer_s: {1: 0.4, 2: 0.25}, restore_s: 0.5}
apis:
  search: {url: "http://127.0.0.1:9000/search", method: POST, concurrency: 4,
           quota: 20, period_s: 1.0, timeout_s: 10, retries: 2}
```
Every error names the path of the bad key, e.g. `gpu.services.judge.dops`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tangram.errors import TangramError, ValidationError

log = logging.getLogger("tangram")
GB = 10**9  # as managers.gpu.GB


def _mapping(path: str, v: Any, allowed: set[str]) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValidationError(path, v, "must be a mapping")
    unknown = sorted(set(v) - allowed)
    if unknown:
        raise ValidationError(f"{path}.{unknown[0]}", v[unknown[0]],
                              f"unknown key (allowed: {sorted(allowed)})")
    return v


def _pos_int(path: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValidationError(path, v, "must be a positive integer")
    return v


def _pos_num(path: str, v: Any, allow_zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or \
            (v == 0 and not allow_zero) or v == float("inf"):
        raise ValidationError(path, v, "must be a positive finite number")
    return float(v)


def build_services(path: str, spec: Any):
    from managers.gpu import Service, ServiceRegistry

    registry = ServiceRegistry()
    for name, s in _mapping(path, spec, set(spec or {})).items():
        sp = f"{path}.{name}"
        s = _mapping(sp, s, {"memory_gb", "dops", "infer_s", "restore_s"})
        if "memory_gb" not in s:
            raise ValidationError(f"{sp}.memory_gb", None, "is required")
        mem = int(_pos_num(f"{sp}.memory_gb", s["memory_gb"]) * GB)
        dops = s.get("dops", [1])
        if not isinstance(dops, list) or not dops:
            raise ValidationError(f"{sp}.dops", dops, "must be a list of GPU counts")
        dops = tuple(_pos_int(f"{sp}.dops", d) for d in dops)
        infer = {int(k): _pos_num(f"{sp}.infer_s.{k}", v)
                 for k, v in _mapping(f"{sp}.infer_s", s.get("infer_s"),
                                      {*dops, *map(str, dops)}).items()}
        restore = s.get("restore_s")
        try:
            registry.register(Service(name, {k: mem for k in dops},
                                      {k: _pos_num(f"{sp}.restore_s", restore, True)
                                       for k in dops} if restore is not None else {},
                                      infer))
        except ValidationError as exc:
            raise ValidationError(f"{sp}.{exc.field.split('.')[-1]}", exc.value,
                                  exc.problem) from None
    return registry


def build_gpu(path: str, spec: Mapping[str, Any] | None):
    from managers.gpu import GpuManager, Residency, create_backend
    from tangram.pools import ChunkPool
    from topology import ChunkTree, discover_gpus

    spec = _mapping(path, spec, {"backend", "nodes", "gpus_per_node", "memory_gb", "services",
                                 "options"})
    backend = spec.get("backend")
    found = discover_gpus()
    if backend is None:
        backend = "sim"
        if found.gpus:
            log.info("gpu: NVML found %d GPUs; using the simulated backend unless gpu.backend "
                     "is set (torch or http)", len(found.gpus))
        else:
            log.info("gpu: no GPU (%s): using a simulated GPU pool", found.reason)
    nodes = _pos_int(f"{path}.nodes", spec.get("nodes", 1))
    per_node = _pos_int(f"{path}.gpus_per_node", spec.get("gpus_per_node", 8))
    if per_node & (per_node - 1):
        raise ValidationError(f"{path}.gpus_per_node", per_node, "must be a power of two")
    mem = int(_pos_num(f"{path}.memory_gb", spec.get("memory_gb", 80)) * GB)
    registry = build_services(f"{path}.services", spec.get("services"))
    names = [f"gpu{i}" for i in range(nodes)]
    pool = ChunkPool("gpu", {n: ChunkTree(per_node, n) for n in names})
    try:
        residency = Residency({n: [mem] * per_node for n in names}, registry)
    except ValidationError as exc:
        raise ValidationError(f"{path}.services", exc.value, exc.problem) from None
    options = _mapping(f"{path}.options", spec.get("options"), set(spec.get("options") or {}))
    return GpuManager(pool, residency, create_backend(backend, **options))


API_KEYS = {"url", "method", "headers", "concurrency", "quota", "period_s", "timeout_s",
            "retries", "backoff_s"}


def build_apis(path: str, spec: Any) -> dict:
    """One `ApiManager` serving every configured API; returns {name: manager}."""
    if not spec:
        return {}
    from managers.api import ApiConfig, ApiManager
    from managers.basic import Limits

    configs = []
    for name, s in _mapping(path, spec, set(spec)).items():
        sp = f"{path}.{name}"
        s = _mapping(sp, s, API_KEYS)
        if "url" not in s:
            raise ValidationError(f"{sp}.url", None, "is required")
        try:
            limits = Limits(s.get("concurrency"), s.get("quota"), s.get("period_s", 1.0))
            configs.append(ApiConfig(
                str(name), s["url"], limits, s.get("method", "POST"), s.get("headers") or {},
                s.get("timeout_s", 30.0), s.get("retries", 0), s.get("backoff_s", 0.1)))
        except ValidationError as exc:
            field = exc.field.split(".")[-1].removeprefix(f"api[{name}]")
            raise ValidationError(f"{sp}.{field or 'limits'}", exc.value, exc.problem) from None
    manager = ApiManager(configs)
    return {c.name: manager for c in configs}


def build_cpu(path: str, spec: Mapping[str, Any] | None):
    from managers.cpu import CpuManager

    spec = _mapping(path, spec, {"backend"})
    return CpuManager(spec.get("backend", "auto"))


def build(doc: Mapping[str, Any]):
    from tangram.runtime import Tangram

    doc = _mapping("config", doc, {"policy", "cpu", "gpu", "apis", "idle_env_s"})
    policy = doc.get("policy", "heuristic")
    options: dict[str, Any] = {}
    if isinstance(policy, dict):
        options = dict(policy)
        policy = options.pop("name", "heuristic")
    if not isinstance(policy, str):
        raise ValidationError("policy", policy, "must be a policy name or {name: ..., options}")
    idle = doc.get("idle_env_s")
    cpu = build_cpu("cpu", doc.get("cpu")) if doc.get("cpu", {}) is not False else None
    gpu = build_gpu("gpu", doc["gpu"]) if doc.get("gpu") else None
    apis = build_apis("apis", doc.get("apis"))
    try:
        return Tangram(cpu=cpu, gpu=gpu, apis=apis, policy=policy, policy_options=options,
                       idle_env_s=None if idle is None else _pos_num("idle_env_s", idle))
    except ValidationError as exc:
        if exc.field.startswith("allocator"):
            raise ValidationError("policy" + exc.field.removeprefix("allocator"), exc.value,
                                  exc.problem) from None
        raise


def load_config(path: str | Path):
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise TangramError(f"config {path}: not found") from None
    except yaml.YAMLError as exc:
        raise TangramError(f"config {path}: not valid YAML ({exc})") from None
    return build(doc or {})


def build_local(cpu_backend: str = "auto", services: Mapping[str, Any] | None = None,
                apis: Mapping[str, Any] | None = None, policy: str = "heuristic",
                policy_options: Mapping[str, Any] | None = None,
                idle_env_s: float | None = None, gpu: Mapping[str, Any] | None = None):
    """The embedded default: this machine's cores, a GPU pool (simulated when no GPU), the
    given services and APIs. Nothing to start."""
    doc: dict[str, Any] = {"policy": {"name": policy, **dict(policy_options or {})},
                           "cpu": {"backend": cpu_backend},
                           "gpu": {**dict(gpu or {}), "services": dict(services or {})}}
    if apis:
        doc["apis"] = dict(apis)
    if idle_env_s is not None:
        doc["idle_env_s"] = idle_env_s
    return build(doc)
