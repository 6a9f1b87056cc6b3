"""The API manager against a real loopback HTTP server that enforces its own rate limit."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from managers.api import ApiConfig, ApiManager, ApiRequest
from managers.basic import Limits
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import Placement


def call(api: ApiConfig, req: ApiRequest) -> Assignment:
    a = Action(f"call-{uuid.uuid4().hex[:6]}", {api.resource: 1}, payload=req)
    return Assignment(a, {api.resource: 1}, {api.resource: Placement("basic")})


def test_flow_control_never_draws_429_at_full_load(upstream):
    api = ApiConfig(
        "search",
        upstream.url,
        Limits(quota=upstream.limit, period_s=upstream.period, concurrency=16),
    )
    m = ApiManager([api])

    async def go():
        try:
            return await asyncio.gather(
                *(
                    m.run(call(api, ApiRequest("/q", json={"i": i})))
                    for i in range(5 * upstream.limit)
                )
            )
        finally:
            await m.close()

    outcomes = asyncio.run(go())
    assert upstream.answered[429] == 0, upstream.answered
    assert all(o.status == "ok" and o.output.status_code == 200 for o in outcomes)
    assert sorted(o.output.body["echo"]["i"] for o in outcomes) == list(range(5 * upstream.limit))


def test_naive_concurrent_calls_draw_many_429(upstream):
    async def go():
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(
                *(
                    client.post(upstream.url + "/q", json={"i": i})
                    for i in range(5 * upstream.limit)
                )
            )

    answers = asyncio.run(go())
    assert sum(r.status_code == 429 for r in answers) >= 2 * upstream.limit
    assert upstream.answered[429] >= 2 * upstream.limit


def test_errors_timeouts_and_retries_are_outcomes(upstream):
    limits = Limits(quota=upstream.limit, period_s=upstream.period)
    api = ApiConfig("svc", upstream.url, limits, retries=2, backoff_s=0.01)
    quick = ApiConfig("quick", upstream.url, limits, timeout_s=0.2)
    down = ApiConfig("down", "http://127.0.0.1:9", limits)
    m = ApiManager([api, quick, down])

    async def go():
        try:
            o = await m.run(call(api, ApiRequest("/fail")))
            assert o.status == "error" and o.output.status_code == 500 and "HTTP 500" in o.detail
            o = await m.run(call(quick, ApiRequest("/slow")))
            assert o.status == "timeout" and "0.2 s" in o.detail
            o = await m.run(call(down, ApiRequest("/x")))
            assert o.status == "failed" and "ConnectError" in o.detail
            o = await m.run(call(api, "not a request"))
            assert o.status == "failed" and "ApiRequest" in o.detail
        finally:
            await m.close()

    asyncio.run(go())


def test_retries_count_against_the_quota(upstream):
    """A misconfigured quota (twice the upstream's) draws some 429s; retries, each a quota use,
    still get every call through."""
    api = ApiConfig(
        "over",
        upstream.url,
        Limits(quota=2 * upstream.limit, period_s=upstream.period),
        retries=6,
        backoff_s=upstream.period / 2,
    )
    m = ApiManager([api])

    async def go():
        try:
            return await asyncio.gather(
                *(m.run(call(api, ApiRequest("/q", json=i))) for i in range(4 * upstream.limit))
            )
        finally:
            await m.close()

    outcomes = asyncio.run(go())
    assert all(o.status == "ok" for o in outcomes), [o.detail for o in outcomes]
    attempts = sum(o.output.attempts for o in outcomes)
    assert attempts == len(outcomes) + upstream.answered[429]
    assert m.gates[api.resource].uses == attempts


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"name": "a:b"}, "api.name"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"retries": -1}, "retries"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_config_validation(kw, field):
    args = {"name": "x", "base_url": "http://127.0.0.1:1", "limits": Limits(concurrency=1), **kw}
    with pytest.raises(ValidationError, match=field):
        ApiConfig(**args)
