"""`managers.flow` step by step (mutation testing, docs/mutation.md): the exact additive
increase, the count of quiet answers that lifts a ceiling (and its doubling after a failed
probe), the pause, the ceiling only ever lowered by a 429, the counters, the checks of the
arguments, and `WindowGate` holding at most the window in flight."""

from __future__ import annotations

import asyncio

import pytest

from managers.flow import AimdWindow, WindowGate
from tangram.errors import ValidationError


@pytest.mark.parametrize("name", ["initial", "probe_after", "floor", "most"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_every_argument_must_be_a_positive_integer(name, bad):
    args = {"initial": 4, name: bad}
    with pytest.raises(ValidationError) as e:
        AimdWindow(**args)
    assert e.value.field == f"flow.{name}"
    assert e.value.value == bad


def test_most_may_be_none_and_the_rest_still_checked():
    assert AimdWindow(4, most=None).allowed(0.0) == 4
    with pytest.raises(ValidationError):
        AimdWindow(4, floor=0, most=None)


def test_additive_increase_is_one_over_the_window():
    w = AimdWindow(4)
    w.answered(0.0)
    assert w.window == pytest.approx(4.25)
    w.answered(0.0)
    assert w.window == pytest.approx(4.25 + 1 / 4.25)


def test_a_429_pauses_for_its_retry_after_and_counts():
    w = AimdWindow(8)
    w.refused_answer(sent_at=9.0, in_flight_before=6, retry_after_s=5.0, now=10.0)
    assert w.refused == 1 and w.cuts == 1
    assert w.allowed(10.0) == 0 and w.allowed(14.9) == 0
    assert w.allowed(15.0) == 3  # min(8, ceiling 6) halved
    w.refused_answer(sent_at=9.5, in_flight_before=2, retry_after_s=0.0, now=11.0)
    assert w.refused == 2 and w.cuts == 1, "sent before the last cut: no second cut"


def test_the_ceiling_is_only_ever_lowered_by_a_429():
    w = AimdWindow(16)
    w.refused_answer(0.0, 3, 0.0, 1.0)
    assert w.ceiling == 3
    w.refused_answer(2.0, 6, 0.0, 3.0)  # a later 429 with more in flight: the limit is <= 3
    assert w.ceiling == 3
    w.refused_answer(4.0, 2, 0.0, 5.0)
    assert w.ceiling == 2


def grow_to_ceiling(w: AimdWindow, now: float) -> None:
    while w.window < w.ceiling:
        w.answered(now)


def quiet_answers_until_lifted(w: AimdWindow, now: float, limit: int = 1000) -> int:
    for n in range(1, limit + 1):
        w.answered(now)
        if w.ceiling is None:
            return n
    raise AssertionError("the ceiling was never lifted")


def test_the_ceiling_lifts_after_exactly_probe_after_quiet_answers_at_it():
    w = AimdWindow(8, probe_after=5)
    w.refused_answer(0.0, 4, 0.0, 1.0)
    grow_to_ceiling(w, 2.0)
    assert w.window == 4.0 and w.ceiling == 4
    assert quiet_answers_until_lifted(w, 2.0) == 5


def test_a_probe_that_draws_a_429_doubles_the_wait_and_a_plain_cut_does_not():
    w = AimdWindow(8, probe_after=3)
    w.refused_answer(0.0, 4, 0.0, 1.0)
    grow_to_ceiling(w, 2.0)
    assert quiet_answers_until_lifted(w, 2.0) == 3
    w.refused_answer(3.0, 4, 0.0, 3.0)  # the probe failed: probe half as often
    grow_to_ceiling(w, 4.0)
    w.refused_answer(5.0, 4, 0.0, 5.0)  # a cut that was no probe: the wait stays doubled
    grow_to_ceiling(w, 6.0)
    assert quiet_answers_until_lifted(w, 6.0) == 6


def test_the_window_stops_at_most_and_never_below_the_floor():
    w = AimdWindow(2, most=3, floor=2)
    for _ in range(50):
        w.answered(0.0)
    assert w.window == 3.0 and w.allowed(0.0) == 3
    w.refused_answer(1.0, 1, 0.0, 1.0)
    assert w.allowed(1.0) == 2


def test_the_gate_holds_at_most_the_window_in_flight():
    async def run() -> tuple[int, list[int]]:
        t = [0.0]
        gate = WindowGate(AimdWindow(2), clock=lambda: t[0])
        peak, befores = 0, []

        async def one() -> None:
            nonlocal peak
            async with gate.attempt() as (sent_at, before):
                assert sent_at == 0.0
                befores.append(before)
                peak = max(peak, gate.in_flight)
                await asyncio.sleep(0)
                await asyncio.sleep(0)

        await asyncio.gather(*(one() for _ in range(6)))
        assert gate.in_flight == 0
        return peak, befores

    peak, befores = asyncio.run(run())
    assert peak == 2
    assert len(befores) == 6 and set(befores) == {0, 1}  # ours in flight before each
