"""`invoke` and `call_api` over HTTP, end to end: a configured (simulated) GPU service and a real
rate-limited loopback API behind the API manager; plus the Prometheus metrics they feed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tangram import Tangram
from tangram.runtime.server import create_app, serve_in_thread


def test_invoke_and_call_api_over_http(upstream) -> None:
    tg = Tangram.from_dict(
        {
            "cpu": {"backend": "sim"},
            "gpu": {
                "backend": "sim",
                "nodes": 1,
                "gpus_per_node": 4,
                "memory_gb": 80,
                "services": {
                    "judge": {
                        "memory_gb": 30,
                        "dops": [1, 2],
                        "infer_s": {1: 0.02, 2: 0.01},
                        "restore_s": 0.05,
                    }
                },
            },
            "apis": {
                "search": {
                    "url": upstream.url + "/search",
                    "concurrency": 4,
                    "quota": upstream.limit,
                    "period_s": upstream.period,
                }
            },
        }
    )
    with serve_in_thread(create_app(tg)) as url, httpx.Client(base_url=url, timeout=30) as http:
        first = http.post(
            "/v1/services/judge/invoke",
            json={"payload": {"token_ids": [1, 2, 3]}, "gpus": {"min": 1, "max": 2}},
        )
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["status"] == "ok" and body["units"]["gpu"] in (1, 2)
        assert body["restore_s"] > 0 and body["placement"]["gpu"]["chunk"] is not None
        again = http.post(
            "/v1/services/judge/invoke",
            json={"payload": {"token_ids": [4]}, "gpus": body["units"]["gpu"]},
        )
        assert again.json()["restore_s"] == 0  # resident: no second restore

        # 3x the upstream's window of calls at once: flow control keeps it from answering 429
        with ThreadPoolExecutor(16) as pool:
            answers = list(
                pool.map(
                    lambda i: http.post("/v1/apis/search/call", json={"payload": {"q": i}}),
                    range(upstream.limit * 3),
                )
            )
        assert all(a.status_code == 200 for a in answers)
        assert all(a.json()["status"] == "ok" for a in answers), answers[0].text
        assert answers[0].json()["output"]["status_code"] == 200
        assert upstream.answered[429] == 0 and upstream.answered[200] == upstream.limit * 3

        metrics = http.get("/metrics").text
        assert http.get("/v1/status").json()["api_throttled"]["search"] > 0  # it held calls back
        assert 'tangram_actions_total{kind="api:search",status="ok"}' in metrics
        assert 'tangram_restores_total{service="judge"} 1.0' in metrics
        assert http.post("/v1/apis/nope/call", json={"payload": {}}).status_code == 404
