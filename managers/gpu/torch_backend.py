"""The `torch` backend: real, in-process services that are PyTorch modules (needs torch).

At deploy a service's module is built once and its weights are kept in host memory, pinned when
CUDA is available (pinned pages are what make host-to-device copies run at full bandwidth).
A restore on a k-GPU chunk copies the weights to each GPU of the chunk (k data-parallel
replicas, so every GPU holds the full footprint, as `Service.uniform` accounts it); evict
drops those device copies (nothing is written back); invoke runs the forward pass with the
device copies through `torch.func.functional_call`, splitting the request's sequences over the
replicas. Without CUDA it refuses to start, unless asked to stand in on the CPU
(`cpu_stand_in=True`): the "device" is then the CPU, a restore still makes a separate copy of
every tensor and an evict frees it, so tests can check that copies really happen and really go.

What a copy holds per GPU: the full weights (data-parallel replicas), declared so
(`Service.uniform`, `torch_service`), so the residency cache accounts this backend's copies as
it holds them. Why not tensor-parallel shards, as the simulator's workloads and the inference
servers behind the `http` backend (SGLang, vLLM) hold them (`Service.sharded`: weights / k plus
a KV cache per GPU): a shard group needs collective communication inside every layer's forward
pass (an all-reduce per layer over NCCL), which a plain PyTorch module does not do; splitting a
request's sequences over full replicas gives a k-GPU chunk real k-way speed without it.

A model is a `TinyLMConfig`, a mapping of its fields (as YAML gives it: `model: {dim: 64}`),
or a factory returning an `nn.Module`.

One backend object serves one machine; `node` only keys the resident copies (a multi-node
deployment runs one backend per node agent).

torch is the gpu extra: it is imported when a backend is built (`BackendUnavailable` naming the
fix where it is missing), never when this module is, so callers import this module at their top.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from managers.gpu import tinylm
from managers.gpu.backend import Chunk, GpuBackend
from managers.gpu.services import Service
from managers.gpu.tinylm import TinyLMConfig
from tangram.errors import BackendUnavailable, ValidationError

if TYPE_CHECKING:
    import torch
    from torch import nn

ModelSource = TinyLMConfig | Callable[[], Any]  # a config, or a factory of an `nn.Module`
Key = tuple[str, str, Chunk]


def _torch() -> ModuleType:
    """torch, imported on first use (the gpu extra)."""
    try:
        import torch  # optional third-party dependency
    except ImportError as exc:
        raise BackendUnavailable(
            f"GPU backend 'torch' cannot load ({exc}); install the extra: "
            "pip install 'arl-tangram[gpu]'"
        ) from None
    return torch


def torch_service(
    name: str, cfg: TinyLMConfig, dops: tuple[int, ...] = (1,), reserve_bytes: int = 0
) -> Service:
    """A service whose footprint per GPU is the model's weights (one replica per GPU)."""
    return Service.uniform(name, cfg.nbytes() + reserve_bytes, dops)


def tensors_nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class TorchBackend(GpuBackend):
    """Services are modules built from `models[name]` (a `TinyLMConfig` or a factory).

    The backend runs on CUDA. Without a CUDA device it raises `BackendUnavailable` unless
    `cpu_stand_in=True` asks it to stand in on the CPU (tests, machines without a GPU);
    `use_cuda=False` also asks for the CPU. `release_cached` returns freed device memory to the
    driver after each evict (`torch.cuda.empty_cache`), so other processes on the GPU see it;
    within this process the caching allocator would reuse it either way.
    """

    name = "torch"

    def __init__(
        self,
        models: Mapping[str, ModelSource | Mapping[str, Any]],
        use_cuda: bool | None = None,
        release_cached: bool = True,
        cpu_stand_in: bool = False,
    ) -> None:
        torch = _torch()
        self.models = {n: _source(n, m) for n, m in models.items()}
        have = torch.cuda.is_available()
        if use_cuda is None and not have and not cpu_stand_in:
            raise BackendUnavailable(
                "GPU backend 'torch': no CUDA device (torch "
                f"{torch.__version__}); set gpu.options.cpu_stand_in: true "
                "to run it on the CPU as a stand-in, or gpu.backend: sim"
            )
        self.cuda = have if use_cuda is None else use_cuda
        if self.cuda and not have:
            raise ValidationError("gpu.torch.use_cuda", use_cuda, "CUDA is not available")
        self.release_cached = release_cached
        self._modules: dict[str, nn.Module] = {}
        self.host: dict[str, dict[str, torch.Tensor]] = {}
        self.device: dict[Key, list[dict[str, torch.Tensor]]] = {}

    # -- what tests and benchmarks read -------------------------------------------------------
    def device_of(self, gpu: int) -> torch.device:
        return self.devices_of((gpu, gpu + 1))[0]

    def devices_of(self, chunk: Chunk) -> list[torch.device]:
        """The devices of the chunk's GPUs (the CPU for each, standing in); `ValidationError`
        naming the chunk's GPUs and the devices present where the machine lacks some."""
        torch = _torch()
        lo, hi = chunk[0], chunk[1]
        if not self.cuda:
            return [torch.device("cpu")] * (hi - lo)
        have = torch.cuda.device_count()
        if lo < 0 or hi > have:
            raise ValidationError("gpu.chunk", (lo, hi), missing_devices((lo, hi), have))
        return [torch.device("cuda", g) for g in range(lo, hi)]

    def device_bytes(self) -> int:
        """Bytes held by all device copies (the simulated device's, on CPU)."""
        return sum(tensors_nbytes(r) for reps in self.device.values() for r in reps)

    # -- backend --------------------------------------------------------------------------
    async def deploy(self, service: Service) -> None:
        if service.name in self.host:
            return
        source = self.models.get(service.name)
        if source is None:
            raise ValidationError(
                f"gpu.torch.models.{service.name}",
                None,
                f"no model for this service (models: {sorted(self.models)})",
            )
        module = tinylm.TinyLM(source) if isinstance(source, TinyLMConfig) else source()
        module.eval()
        state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        host = {n: (t.detach().pin_memory() if self.cuda else t.detach()) for n, t in state.items()}
        module.load_state_dict(host, assign=True, strict=False)
        self._modules[service.name] = module
        self.host[service.name] = host

    async def restore(self, service: Service, node: str, chunk: Chunk) -> float:
        await self.deploy(service)
        key = (service.name, node, (chunk[0], chunk[1]))
        if key in self.device:
            return 0.0
        return await asyncio.to_thread(self._restore, service.name, key, chunk)

    def _restore(self, name: str, key: Key, chunk: Chunk) -> float:
        t0 = time.perf_counter()
        devices = self.devices_of(chunk)
        replicas = [
            {n: t.to(dev, non_blocking=True, copy=True) for n, t in self.host[name].items()}
            for dev in devices
        ]
        if self.cuda:
            for dev in devices:
                _torch().cuda.synchronize(dev)
        self.device[key] = replicas
        return time.perf_counter() - t0

    async def evict(self, service: Service, node: str, chunk: Chunk) -> None:
        replicas = self.device.pop((service.name, node, (chunk[0], chunk[1])), None)
        del replicas
        if self.cuda and self.release_cached:
            _torch().cuda.empty_cache()

    async def invoke(self, service: Service, node: str, chunk: Chunk, payload: Any) -> Any:
        key = (service.name, node, (chunk[0], chunk[1]))
        if key not in self.device:
            raise RuntimeError(f"torch: {service.name} is not resident on {node}{chunk}")
        tokens = _tokens(payload)
        return await asyncio.to_thread(self._invoke, service.name, key, tokens)

    def _invoke(self, name: str, key: Key, tokens: list[list[int]]) -> dict[str, Any]:
        module, replicas = self._modules[name], self.device[key]
        out: list[list[float]] = [[] for _ in tokens]
        torch = _torch()
        with torch.inference_mode():
            for i, seq in enumerate(tokens):
                params = replicas[i % len(replicas)]
                dev = next(iter(params.values())).device
                x = torch.tensor([seq], dtype=torch.long, device=dev)
                out[i] = torch.func.functional_call(module, params, (x,))[0].cpu().tolist()
        return {"service": name, "logprobs": out, "replicas": len(replicas)}

    async def close(self) -> None:
        self.device.clear()
        self.host.clear()
        self._modules.clear()
        if self.cuda and self.release_cached:
            _torch().cuda.empty_cache()


def missing_devices(chunk: Chunk, have: int) -> str:
    """What a chunk needs that a machine with `have` CUDA devices lacks, in words: "a 2-GPU
    chunk needs GPUs 0-1; this machine has GPU 0 only"."""
    lo, hi = chunk[0], chunk[1]
    needs = f"GPU {lo}" if hi - lo == 1 else f"GPUs {lo}-{hi - 1}"
    if have <= 0:
        present = "no CUDA device"
    elif have == 1:
        present = "GPU 0 only"
    else:
        present = f"GPUs 0-{have - 1} only"
    return f"a {hi - lo}-GPU chunk needs {needs}; this machine has {present}"


def _source(name: str, model: Any) -> ModelSource:
    """A model as given: a config, a factory, or a mapping of `TinyLMConfig` fields."""
    if isinstance(model, TinyLMConfig) or callable(model):
        return model
    if isinstance(model, Mapping):
        known = set(TinyLMConfig.__dataclass_fields__)
        bad = sorted(set(model) - known)
        if bad:
            raise ValidationError(
                f"gpu.services.{name}.model.{bad[0]}",
                model[bad[0]],
                f"not a TinyLM size (known: {sorted(known)})",
            )
        try:
            return TinyLMConfig(**model)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"gpu.services.{name}.model", dict(model), str(exc)) from None
    raise ValidationError(
        f"gpu.services.{name}.model",
        model,
        "must be TinyLM sizes (a mapping), a TinyLMConfig or a factory",
    )


def _tokens(payload: Any) -> list[list[int]]:
    """The request: {"tokens": [[id, ...], ...]}, each sequence at least 2 tokens long."""
    seqs = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(seqs, list) or not all(
        isinstance(s, list) and len(s) >= 2 and all(isinstance(t, int) for t in s) for s in seqs
    ):
        raise ValidationError(
            "payload.tokens", seqs, "must be a list of token-id lists of length >= 2"
        )
    return seqs
