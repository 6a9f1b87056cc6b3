"""`TangramClient`: the Python API of `Tangram`, over HTTP to a `tangram serve` server.

```python
async with TangramClient("http://127.0.0.1:8470", token=None) as tg:
    env = await tg.open_env("traj-1", memory_mb=1024)
    r = await tg.exec(env, "pytest -q tests", cpu=(1, 8), elastic=True, timeout=600)
    await tg.close_env(env)
```

Same methods, same arguments, same `Result`s as `Tangram` (`open_env`, `exec` and `close_env`
are `tangram.runtime.api.TangramApi`, which both implement). A request the server refuses raises
what `Tangram` would have raised: `ValidationError` (a bad value, an unknown environment,
service or API) with the server's field, value and problem; `Infeasible` for a demand no pool
can ever meet; `TangramError` otherwise (wrong token, shutting down, server fault).
Cancelling a call closes its connection, which cancels the action if it is still queued.
"""

from __future__ import annotations

import base64
from typing import Any, Self
from urllib.parse import quote

import httpx

from tangram.errors import (
    Infeasible,
    LimitReached,
    QueueFull,
    ShuttingDown,
    TangramError,
    ValidationError,
)
from tangram.results import Result, parse_status
from tangram.runtime.http.errors import SHUTTING_DOWN
from tangram.runtime.kernels import Cell
from tangram.runtime.status import StatusSnapshot


def demand_json(demand: Any) -> Any:
    """A demand as the server takes it: a (lo, hi) tuple becomes {"min", "max"}."""
    if isinstance(demand, tuple) and len(demand) == 2:
        return {"min": demand[0], "max": demand[1]}
    if isinstance(demand, tuple | set | frozenset):
        return sorted(demand)
    return demand


class TangramClient:
    """An asyncio client of one server. `timeout`: seconds to wait for an answer (None: as
    long as the action takes, queueing included); `limits`: httpx connection-pool limits."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float | None = None,
        limits: httpx.Limits | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
            limits=limits or httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the operations --------------------------------------------------------------------------
    async def open_env(
        self,
        trajectory: str,
        memory_mb: int = 1024,
        network: bool = False,
        *,
        image: str | None = None,
        disk_mb: int | None = None,
        snapshot: str | None = None,
    ) -> str:
        body = {"trajectory": trajectory, "memory_mb": memory_mb, "network": network}
        body.update(
            {
                k: v
                for k, v in (("image", image), ("disk_mb", disk_mb), ("snapshot", snapshot))
                if v is not None
            }
        )
        doc = await self._request("POST", "/v1/envs", body)
        return str(doc["env_id"])

    async def fork_env(self, env_id: str, trajectories: list[str]) -> list[str]:
        doc = await self._request(
            "POST",
            f"/v1/envs/{_segment(env_id, 'env_id')}/fork",
            {"trajectories": list(trajectories)},
        )
        return [str(e) for e in doc["env_ids"]]

    async def snapshot(self, env_id: str) -> str:
        doc = await self._request("POST", f"/v1/envs/{_segment(env_id, 'env_id')}/snapshot")
        return str(doc["snapshot_id"])

    async def snapshots(self) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/v1/snapshots"))["snapshots"])

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._request("DELETE", f"/v1/snapshots/{_segment(snapshot_id, 'snapshot')}")

    async def write_files(self, env_id: str, files: dict[str, bytes]) -> None:
        body = {"files": {p: base64.b64encode(data).decode() for p, data in files.items()}}
        await self._request("PUT", f"/v1/envs/{_segment(env_id, 'env_id')}/files", body)

    async def tar_files(self, env_id: str, path: str = "/sandbox") -> bytes:
        """The tar archive of one folder of the environment."""
        response = await self._http.get(
            f"/v1/envs/{_segment(env_id, 'env_id')}/files/tar", params={"path": path}
        )
        _raise_for(response)
        return response.content

    async def read_files(self, env_id: str, paths: list[str]) -> dict[str, bytes | None]:
        doc = await self._request(
            "POST", f"/v1/envs/{_segment(env_id, 'env_id')}/files/read", {"paths": list(paths)}
        )
        return {p: None if v is None else base64.b64decode(v) for p, v in doc["files"].items()}

    async def close_env(self, env_id: str) -> None:
        await self._request("DELETE", f"/v1/envs/{_segment(env_id, 'env_id')}")

    async def exec(
        self,
        env: str,
        command: str | list[str],
        cpu: Any = 1,
        elastic: bool = False,
        timeout: float = 60.0,
        output_cap: int | None = None,
        kind: str | None = None,
        gpus: Any = None,
    ) -> Result:
        """`Tangram.exec` over HTTP; `output_cap` and `gpus` as there (None: the default cap,
        no GPU; either is sent only when given)."""
        body = {
            "command": command if isinstance(command, str) else list(command),
            "cpu": demand_json(cpu),
            "elastic": elastic,
            "timeout": timeout,
            **({"output_cap": output_cap} if output_cap is not None else {}),
            **({"kind": kind} if kind is not None else {}),
            **({"gpus": demand_json(gpus)} if gpus is not None else {}),
        }
        return _result(
            await self._request("POST", f"/v1/envs/{_segment(env, 'env_id')}/exec", body)
        )

    async def open_session(self, env: str, name: str = "default") -> str:
        """`Tangram.open_session` over HTTP."""
        path = f"/v1/envs/{_segment(env, 'env_id')}/sessions"
        return str((await self._request("POST", path, {"name": name}))["session"])

    async def run(
        self,
        env: str,
        name: str,
        command: str,
        cpu: Any = 1,
        elastic: bool = False,
        timeout: float = 60.0,
        output_cap: int | None = None,
        *,
        interactive: bool = False,
        expect: list[str] | tuple[str, ...] = (),
        kind: str | None = None,
    ) -> Result:
        """`Tangram.run` over HTTP: one command of a shell session, as one action."""
        body = {
            "command": command,
            "cpu": demand_json(cpu),
            "elastic": elastic,
            "timeout": timeout,
            "interactive": interactive,
            "expect": list(expect),
            **({"output_cap": output_cap} if output_cap is not None else {}),
            **({"kind": kind} if kind is not None else {}),
        }
        path = f"/v1/envs/{_segment(env, 'env_id')}/sessions/{_segment(name, 'session')}/run"
        return _result(await self._request("POST", path, body))

    async def close_session(self, env: str, name: str) -> None:
        path = f"/v1/envs/{_segment(env, 'env_id')}/sessions/{_segment(name, 'session')}"
        await self._request("DELETE", path)

    async def sessions(self, env: str) -> list[str]:
        path = f"/v1/envs/{_segment(env, 'env_id')}/sessions"
        return list((await self._request("GET", path))["sessions"])

    async def open_kernel(self, env: str) -> str:
        """`Tangram.open_kernel` over HTTP: the kernel's handle `env_id/name`."""
        doc = await self._request("POST", f"/v1/envs/{_segment(env, 'env_id')}/kernels")
        return f"{env}/{doc['kernel']}"

    async def run_cell(self, kernel: str, code: str, cpu: Any = 1, timeout: float = 60.0) -> Cell:
        """`Tangram.run_cell` over HTTP: the cell's outcome."""
        env, _, name = kernel.partition("/")
        path = f"/v1/envs/{_segment(env, 'env_id')}/kernels/{_segment(name, 'kernel')}/cells"
        body = {"code": code, "cpu": demand_json(cpu), "timeout": timeout}
        doc = dict(await self._request("POST", path, body))
        return Cell(**{**doc, "status": parse_status(doc.get("status"))})

    async def close_kernel(self, kernel: str) -> None:
        env, _, name = kernel.partition("/")
        path = f"/v1/envs/{_segment(env, 'env_id')}/kernels/{_segment(name, 'kernel')}"
        await self._request("DELETE", path)

    async def invoke(self, service: str, payload: Any = None, gpus: Any = 1) -> Result:
        body = {"payload": payload, "gpus": demand_json(gpus)}
        path = f"/v1/services/{_segment(service, 'service')}/invoke"
        return _result(await self._request("POST", path, body))

    async def call_api(self, name: str, payload: Any = None) -> Result:
        path = f"/v1/apis/{_segment(name, 'api')}/call"
        return _result(await self._request("POST", path, {"payload": payload}))

    async def status(self) -> StatusSnapshot:
        return StatusSnapshot.from_dict(await self._request("GET", "/v1/status"))

    async def metrics(self) -> str:
        response = await self._http.get("/metrics")
        _raise_for(response)
        return response.text

    # -- transport -------------------------------------------------------------------------------
    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise TangramError(
                f"{method} {path}: no answer from the server ({type(exc).__name__}: {exc})"
            ) from exc
        _raise_for(response)
        return response.json()


def _segment(name: Any, field: str) -> str:
    """A name that fits in one path segment, or the `ValidationError` Tangram would raise."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ValidationError(field, name, "unknown (not a valid name)")
    return quote(name, safe="")


def _result(doc: dict[str, Any]) -> Result:
    return Result.from_dict(doc)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        doc = response.json()
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    message = str(doc.get("error") or response.text[:500] or response.reason_phrase)
    code = response.status_code
    if code == 409:
        raise Infeasible(message)
    if code in (404, 413, 422) and doc.get("field"):
        raise ValidationError(
            str(doc["field"]), doc.get("value"), str(doc.get("problem") or message)
        )
    if code == 429:
        raise QueueFull(message)
    if code == 503:  # the server's two kinds (`http.errors`): its shutdown, a host limit
        shutting = doc.get("problem") == SHUTTING_DOWN
        raise (ShuttingDown if shutting else LimitReached)(message)
    raise TangramError(f"HTTP {code}: {message}")
