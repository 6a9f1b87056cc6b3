"""The `torch` backend: real, in-process services that are PyTorch modules (needs torch).

At deploy a service's module is built once and its weights are kept in host memory, pinned when
CUDA is available (pinned pages are what make host-to-device copies run at full bandwidth).
A restore on a k-GPU chunk copies the weights to each GPU of the chunk (k data-parallel
replicas, so every GPU holds the full footprint, as `Service.uniform` accounts it); evict
drops those device copies (nothing is written back); invoke runs the forward pass with the
device copies through `torch.func.functional_call`, splitting the request's sequences over the
replicas. Without CUDA the "device" is the CPU: a restore still makes a separate copy of every
tensor and an evict frees it, so tests can check that copies really happen and really go.

One backend object serves one machine; `node` only keys the resident copies (a multi-node
deployment runs one backend per node agent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from managers.gpu.backend import Chunk, GpuBackend, register
from managers.gpu.services import Service
from managers.gpu.tinylm import TinyLM, TinyLMConfig
from tangram.errors import ValidationError

ModelSource = TinyLMConfig | Callable[[], nn.Module]
Key = tuple[str, str, Chunk]


def torch_service(name: str, cfg: TinyLMConfig, dops: tuple[int, ...] = (1,),
                  reserve_bytes: int = 0) -> Service:
    """A service whose footprint per GPU is the model's weights (one replica per GPU)."""
    return Service.uniform(name, cfg.nbytes() + reserve_bytes, dops)


def tensors_nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class TorchBackend(GpuBackend):
    """Services are modules built from `models[name]` (a `TinyLMConfig` or a factory).

    `use_cuda=None` uses CUDA when it is available. `release_cached` returns freed device
    memory to the driver after each evict (`torch.cuda.empty_cache`), so other processes on the
    GPU see it; within this process the caching allocator would reuse it either way.
    """

    name = "torch"

    def __init__(self, models: Mapping[str, ModelSource], use_cuda: bool | None = None,
                 release_cached: bool = True) -> None:
        self.models = dict(models)
        self.cuda = torch.cuda.is_available() if use_cuda is None else use_cuda
        if self.cuda and not torch.cuda.is_available():
            raise ValidationError("gpu.torch.use_cuda", use_cuda, "CUDA is not available")
        self.release_cached = release_cached
        self._modules: dict[str, nn.Module] = {}
        self.host: dict[str, dict[str, torch.Tensor]] = {}
        self.device: dict[Key, list[dict[str, torch.Tensor]]] = {}

    # -- what tests and benchmarks read -------------------------------------------------------
    def device_of(self, gpu: int) -> torch.device:
        if not self.cuda:
            return torch.device("cpu")
        if gpu >= torch.cuda.device_count():
            raise ValidationError("gpu.chunk", gpu, f"this machine has "
                                  f"{torch.cuda.device_count()} CUDA devices")
        return torch.device("cuda", gpu)

    def device_bytes(self) -> int:
        """Bytes held by all device copies (the simulated device's, on CPU)."""
        return sum(tensors_nbytes(r) for reps in self.device.values() for r in reps)

    # -- backend --------------------------------------------------------------------------
    async def deploy(self, service: Service) -> None:
        if service.name in self.host:
            return
        source = self.models.get(service.name)
        if source is None:
            raise ValidationError(f"gpu.torch.models.{service.name}", None,
                                  f"no model for this service (models: {sorted(self.models)})")
        module = TinyLM(source) if isinstance(source, TinyLMConfig) else source()
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
        replicas = []
        for g in range(*chunk):
            dev = self.device_of(g)
            replicas.append({n: t.to(dev, non_blocking=True, copy=True)
                             for n, t in self.host[name].items()})
        if self.cuda:
            for g in range(*chunk):
                torch.cuda.synchronize(self.device_of(g))
        self.device[key] = replicas
        return time.perf_counter() - t0

    async def evict(self, service: Service, node: str, chunk: Chunk) -> None:
        replicas = self.device.pop((service.name, node, (chunk[0], chunk[1])), None)
        del replicas
        if self.cuda and self.release_cached:
            torch.cuda.empty_cache()

    async def invoke(self, service: Service, node: str, chunk: Chunk, payload: Any) -> Any:
        key = (service.name, node, (chunk[0], chunk[1]))
        if key not in self.device:
            raise RuntimeError(f"torch: {service.name} is not resident on {node}{chunk}")
        tokens = _tokens(payload)
        return await asyncio.to_thread(self._invoke, service.name, key, tokens)

    def _invoke(self, name: str, key: Key, tokens: list[list[int]]) -> dict[str, Any]:
        module, replicas = self._modules[name], self.device[key]
        out: list[list[float]] = [[] for _ in tokens]
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
            torch.cuda.empty_cache()


def _tokens(payload: Any) -> list[list[int]]:
    """The request: {"tokens": [[id, ...], ...]}, each sequence at least 2 tokens long."""
    seqs = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(seqs, list) or not all(
            isinstance(s, list) and len(s) >= 2 and all(isinstance(t, int) for t in s)
            for s in seqs):
        raise ValidationError("payload.tokens", seqs,
                              "must be a list of token-id lists of length >= 2")
    return seqs


register("torch", TorchBackend)
