"""The HTTP API on a live server (uvicorn on loopback): every operation, the bearer token, and
bad input answered 4xx with a JSON body naming the problem. The CPU pool is simulated (the
machine's own cores, nothing runs; `sleep N` takes N s) so these tests are quick and exact."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from tangram.results import Result
from tangram.runtime.facade import Tangram
from tangram.runtime.server import MAX_BODY, create_app, serve_in_thread

TOKEN = "s3cret"


def sim_seconds(command, cores: int) -> float:
    """`sleep N` lasts N s in the simulator; everything else is instant."""
    words = command.split() if isinstance(command, str) else list(command)
    return float(words[1]) if words[:1] == ["sleep"] and len(words) > 1 else 0.0


def sim_tangram() -> Tangram:
    return Tangram(cpu=CpuManager(SimCpuBackend(sim_seconds, time_scale=1.0)))


@pytest.fixture
def tg() -> Tangram:
    return sim_tangram()


@pytest.fixture
def http(tg: Tangram) -> Iterator[httpx.Client]:
    with (
        serve_in_thread(create_app(tg, token=TOKEN)) as url,
        httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=20
        ) as client,
    ):
        yield client


@pytest.fixture
def env(http: httpx.Client) -> str:
    r = http.post("/v1/envs", json={"trajectory": "t-1", "memory_mb": 256})
    assert r.status_code == 200, r.text
    return r.json()["env_id"]


def test_every_operation_round_trips(http: httpx.Client, tg: Tangram, env: str) -> None:
    r = http.post(f"/v1/envs/{env}/exec", json={"command": "true", "cpu": 1, "timeout": 5})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["status"] == "ok" and doc["exit_code"] == 0 and doc["units"] == {"cpu": 1}
    assert set(doc) >= {"action_id", "stdout", "stderr", "placement", "queued_s", "run_s"}
    r = http.post(
        f"/v1/envs/{env}/exec",
        json={"command": ["pytest", "-q"], "cpu": {"min": 1, "max": 2}, "elastic": True},
    )
    assert r.status_code == 200 and 1 <= r.json()["units"]["cpu"] <= 2
    r = http.post(f"/v1/envs/{env}/exec", json={"command": "true", "cpu": [1, 2]})
    assert r.status_code == 200 and r.json()["units"]["cpu"] in (1, 2)
    status = http.get("/v1/status").json()
    assert status["envs"] == 1 and status["queue"] == 0 and "cpu" in status["pools"]
    metrics = http.get("/metrics").text
    assert 'tangram_actions_total{kind="exec",status="ok"} 3.0' in metrics
    assert "tangram_units_busy" in metrics
    assert http.delete(f"/v1/envs/{env}").json() == {"env_id": env}
    assert http.get("/v1/status").json()["envs"] == 0


def test_schema_is_served_and_names_the_python_fields(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    paths = schema["paths"]
    assert {
        "/v1/envs",
        "/v1/envs/{env_id}/exec",
        "/v1/envs/{env_id}",
        "/v1/services/{name}/invoke",
        "/v1/apis/{name}/call",
        "/v1/status",
        "/metrics",
        "/v1/envs/{env_id}/sessions",
        "/v1/envs/{env_id}/sessions/{name}/run",
        "/v1/envs/{env_id}/kernels/{name}/cells",
        "/swerex/{env_id}/run_in_session",
    } <= set(paths)
    exec_body = schema["components"]["schemas"]["Exec"]["properties"]
    # Tangram.exec's parameters, every one (the client's too: tests/unit/test_interfaces.py)
    assert set(exec_body) == {"command", "cpu", "gpus", "elastic", "timeout", "output_cap", "kind"}
    # the served result model is tangram.results.Result itself, field for field
    result_out = schema["components"]["schemas"]["Result"]["properties"]
    assert set(result_out) == {f.name for f in dataclasses.fields(Result)}


@pytest.mark.parametrize("path", ["/v1/status", "/metrics", "/v1/envs/x/exec"])
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic s3cret", f"bearer{TOKEN}"])
def test_token_is_required(http: httpx.Client, path: str, header: str | None) -> None:
    headers = {"authorization": header} if header else {}
    method = "POST" if path.endswith("exec") else "GET"
    r = httpx.request(method, str(http.base_url) + path, headers=headers, json={"command": "true"})
    assert r.status_code == 401
    assert r.json()["field"] == "authorization"
    assert r.headers["www-authenticate"] == "Bearer"


def test_health_and_schema_need_no_token(http: httpx.Client) -> None:
    base = str(http.base_url)
    assert httpx.get(base + "/healthz").json() == {"ok": True}
    assert httpx.get(base + "/openapi.json").status_code == 200


BAD_EXEC = [  # body, status, field
    ({"command": "true", "cpu": 0}, 422, "cpu"),
    ({"command": "true", "cpu": -1}, 422, "cpu"),
    ({"command": "true", "cpu": True}, 422, "cpu"),
    ({"command": "true", "cpu": "2"}, 422, "cpu"),
    ({"command": "true", "cpu": 1.5}, 422, "cpu"),
    ({"command": "true", "cpu": {"min": 2}}, 422, "cpu"),
    ({"command": "true", "cpu": {"min": 2, "max": 1}}, 422, "cpu"),
    ({"command": "true", "cpu": [1, 1]}, 422, "cpu"),
    ({"command": "true", "cpu": []}, 422, "cpu"),
    ({"command": "true", "cpu": 1 << 30}, 422, "cpu"),
    ({"command": "true", "cpu": 64}, 409, "cpu"),  # no node has 64 cores: Infeasible
    ({"command": "true", "cpu": {"min": 64, "max": 128}}, 409, "cpu"),
    ({"command": "true", "timeout": -1}, 422, "timeout"),
    ({"command": "true", "timeout": 0}, 422, "timeout"),
    ({"command": "true", "timeout": 1e12}, 422, "timeout"),
    ({"command": "true", "timeout": "5"}, 422, "timeout"),
    ({"command": "true", "elastic": "yes"}, 422, "elastic"),
    ({"command": ""}, 422, "command"),
    ({"command": "   "}, 422, "exec.command"),
    ({"command": []}, 422, "command"),
    ({"command": [1, 2]}, 422, "command"),
    ({"command": "a\x00b"}, 422, "command"),
    ({"command": "x" * 70_000}, 422, "command"),
    ({}, 422, "command"),
    ({"command": "true", "extra": 1}, 422, "extra"),
]


@pytest.mark.parametrize("body,status,field", BAD_EXEC)
def test_bad_exec_is_named(
    http: httpx.Client, env: str, body: dict, status: int, field: str
) -> None:
    r = http.post(f"/v1/envs/{env}/exec", json=body)
    assert r.status_code == status, r.text
    doc = r.json()
    assert doc["field"] == field and doc["error"]
    assert http.get("/v1/status").json()["queue"] == 0


@pytest.mark.parametrize(
    "method,path,body,field",
    [
        ("POST", "/v1/envs/env-nope/exec", {"command": "true"}, "env_id"),
        ("DELETE", "/v1/envs/env-nope", None, "env_id"),
        ("POST", "/v1/services/judge/invoke", {"payload": 1}, "service"),
        ("POST", "/v1/apis/search/call", {"payload": {"q": 1}}, "api"),
    ],
)
def test_unknown_names_are_404(
    http: httpx.Client, method: str, path: str, body: dict | None, field: str
) -> None:
    r = http.request(method, path, json=body)
    assert r.status_code == 404, r.text
    assert r.json()["field"] == field


@pytest.mark.parametrize(
    "content,headers",
    [
        (b"{not json", {"content-type": "application/json"}),
        (b"[1, 2]", {"content-type": "application/json"}),
        (b'"text"', {"content-type": "application/json"}),
        (b"\xff\xfe", {"content-type": "application/json"}),
        (b'{"trajectory": "t"}', {"content-type": "text/plain"}),
    ],
)
def test_malformed_bodies_are_422(http: httpx.Client, content: bytes, headers: dict) -> None:
    r = http.post("/v1/envs", content=content, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["error"]


def test_huge_bodies_are_413_declared_or_streamed(http: httpx.Client, env: str) -> None:
    big = b'{"command": "' + b"x" * (MAX_BODY + 10) + b'"}'
    r = http.post(f"/v1/envs/{env}/exec", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    r = http.post(
        f"/v1/envs/{env}/exec", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert http.get("/healthz").status_code == 200


def test_disconnected_client_cancels_its_queued_action(
    http: httpx.Client, tg: Tangram, env: str
) -> None:
    """Both cores busy for 1.5 s; a second exec waits in the queue; its client gives up after
    0.3 s: the action leaves the queue at once and never runs, the first one is unharmed."""
    import threading

    first: dict = {}
    hold = threading.Thread(
        target=lambda: first.update(
            http.post(f"/v1/envs/{env}/exec", json={"command": "sleep 1.5", "cpu": 2}).json()
        )
    )
    hold.start()
    _wait(lambda: http.get("/v1/status").json()["running"] == 1)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{http.base_url}/v1/envs/{env}/exec",
            json={"command": "sleep 0", "cpu": 1},
            headers=http.headers,
            timeout=0.3,
        )
    _wait(lambda: http.get("/v1/status").json()["queue"] == 0, within=1.0)
    assert http.get("/v1/status").json()["running"] == 1
    hold.join(10)
    assert first["status"] == "ok"
    backend = tg.cpu.backend
    assert [c for _, _, c in backend.execs] == ["sleep 1.5"]  # the cancelled one never ran


def test_failing_action_answers_its_result_and_others_carry_on(
    http: httpx.Client, env: str
) -> None:
    r = http.post(f"/v1/envs/{env}/exec", json={"command": "sleep 5", "timeout": 0.2})
    assert r.status_code == 200 and r.json()["status"] == "timeout"
    r = http.post(f"/v1/envs/{env}/exec", json={"command": "true"})
    assert r.json()["status"] == "ok"


def _wait(cond, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
