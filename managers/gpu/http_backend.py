"""The `http` backend: controls real inference servers that give GPU memory back on request.

Each deployed variant is a server process already bound to its chunk's GPUs (launched by the
operator with `--enable-memory-saver` for SGLang, `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1` for vLLM). The backend never starts or kills servers; it moves their
weights between host and GPU memory and forwards requests:

| engine | evict                                 | restore                              | request          |
| ------ | ------------------------------------- | ------------------------------------ | ---------------- |
| sglang | POST /release_memory_occupation {}    | POST /resume_memory_occupation {}    | POST /generate   |
| vllm   | POST /sleep?level=1                   | POST /wake_up                        | POST /v1/completions |

Level-1 sleep keeps the weights in host memory (the paper's "eviction writes nothing back").
At deploy every server of a service is released, so nothing is resident until the residency
cache decides it; the cache and the servers then agree.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from managers.gpu.backend import Chunk, GpuBackend
from managers.gpu.services import Service
from tangram.errors import ValidationError

ENGINES = {
    # engine: (evict path, evict params, restore path, default request path)
    "sglang": ("/release_memory_occupation", None, "/resume_memory_occupation", "/generate"),
    "vllm": ("/sleep", {"level": "1"}, "/wake_up", "/v1/completions"),
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One server holding one service variant on one chunk."""

    url: str
    engine: str = "sglang"
    request_path: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValidationError(
                "endpoint.engine", self.engine, f"must be one of {sorted(ENGINES)}"
            )
        if not self.url.startswith(("http://", "https://")):
            raise ValidationError("endpoint.url", self.url, "must be an http(s) URL")

    @property
    def path(self) -> str:
        return self.request_path or ENGINES[self.engine][3]


class HttpBackend(GpuBackend):
    """`endpoints[(service, node, (start, end))]` names the server of each deployed variant."""

    name = "http"

    def __init__(
        self,
        endpoints: Mapping[tuple[str, str, Chunk], Endpoint],
        timeout_s: float = 300.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.endpoints = {(s, n, (int(c[0]), int(c[1]))): e for (s, n, c), e in endpoints.items()}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=dict(headers or {}))

    def endpoint(self, service: str, node: str, chunk: Chunk) -> Endpoint:
        ep = self.endpoints.get((service, node, (int(chunk[0]), int(chunk[1]))))
        if ep is None:
            raise ValidationError(
                "gpu.http.endpoints",
                (service, node, chunk),
                "no server deployed for this service variant and chunk",
            )
        return ep

    async def _post(self, ep: Endpoint, path: str, params: Any = None, body: Any = None) -> Any:
        r = await self._client.post(
            ep.url.rstrip("/") + path, params=params, json=body if body is not None else {}
        )
        if r.status_code >= 300:
            raise RuntimeError(f"{ep.engine} {ep.url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json() if r.content and "json" in r.headers.get("content-type", "") else None

    async def deploy(self, service: Service) -> None:
        for name, node, chunk in list(self.endpoints):
            if name == service.name:
                await self.evict(service, node, chunk)

    async def restore(self, service: Service, node: str, chunk: Chunk) -> float:
        ep = self.endpoint(service.name, node, chunk)
        t0 = time.perf_counter()
        await self._post(ep, ENGINES[ep.engine][2])
        return time.perf_counter() - t0

    async def evict(self, service: Service, node: str, chunk: Chunk) -> None:
        ep = self.endpoint(service.name, node, chunk)
        path, params = ENGINES[ep.engine][0], ENGINES[ep.engine][1]
        await self._post(ep, path, params=params)

    async def invoke(self, service: Service, node: str, chunk: Chunk, payload: Any) -> Any:
        ep = self.endpoint(service.name, node, chunk)
        return await self._post(ep, ep.path, body=payload)

    async def close(self) -> None:
        await self._client.aclose()
