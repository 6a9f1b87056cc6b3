"""The basic manager's gates: never more than N in flight; never more than N uses in any
window of one period (a use counts from its start until a period after its end)."""

from __future__ import annotations

import asyncio
import time

import pytest

from managers.basic import BasicManager, Limits
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import Placement


def assignment(resource: str, payload) -> Assignment:
    a = Action(f"a{id(payload)}", {resource: 1}, payload=payload)
    return Assignment(a, {resource: 1}, {resource: Placement("basic")})


@pytest.mark.parametrize("n,jobs", [(1, 6), (3, 20), (5, 12)])
def test_concurrency_never_exceeds_n(n: int, jobs: int):
    m = BasicManager({"site": Limits(concurrency=n)})
    state = {"now": 0, "peak": 0}

    async def work():
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return "done"

    async def go():
        return await asyncio.gather(*(m.run(assignment("site", work)) for _ in range(jobs)))

    outcomes = asyncio.run(go())
    assert all(o.status == "ok" and o.output == "done" for o in outcomes)
    assert state["peak"] == min(n, jobs)
    assert m.pools()["site"].capacity() == n


@pytest.mark.parametrize("quota,jobs", [(2, 7), (4, 13)])
def test_quota_sliding_window(quota: int, jobs: int):
    period = 0.05
    m = BasicManager({"qps": Limits(quota=quota, period_s=period)})
    spans: list[tuple[float, float]] = []

    async def work():
        start = time.monotonic()
        await asyncio.sleep(0.002)
        spans.append((start, time.monotonic()))

    async def go():
        return await asyncio.gather(*(m.run(assignment("qps", work)) for _ in range(jobs)))

    assert all(o.status == "ok" for o in asyncio.run(go()))
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    # the (i+quota)-th use starts no earlier than a period after the i-th use ended
    for i in range(len(starts) - quota):
        assert starts[i + quota] >= ends[i] + period - 1e-6


def test_failures_are_outcomes():
    m = BasicManager({"site": Limits(concurrency=1)})

    async def boom():
        raise RuntimeError("upstream exploded")

    async def go():
        o = await m.run(assignment("site", boom))
        assert o.status == "error" and "upstream exploded" in o.detail
        o = await m.run(assignment("site", "not callable"))
        assert o.status == "failed"
        o = await m.run(assignment("other", boom))
        assert o.status == "failed" and "demands none" in o.detail

    asyncio.run(go())


@pytest.mark.parametrize(
    "kw,field",
    [
        ({}, "limits"),
        ({"concurrency": 0}, "limits.concurrency"),
        ({"quota": 2, "period_s": 0}, "limits.period_s"),
        ({"quota": True}, "limits.quota"),
    ],
)
def test_limits_validation(kw, field):
    with pytest.raises(ValidationError, match=field):
        Limits(**kw)
