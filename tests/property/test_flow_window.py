"""`AimdWindow` against a simulated upstream with a fixed concurrency limit: whatever it starts
with, the window ends near the limit and the 429s thin out (one per failed probe, probes ever
rarer), and it never allows less than its floor or more than its ceiling."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from managers.flow import AimdWindow


def drive(w: AimdWindow, limit: int, steps: int) -> list[int]:
    """Each step: send what the window allows (one by one), the upstream refuses a call that
    finds `limit` in flight; every call it took ends at the next step. 429s per step."""
    refused = []
    for t in range(steps):
        now = float(t)
        allowed, in_flight, n = w.allowed(now), 0, 0
        taken = 0
        while in_flight < allowed:
            before = in_flight
            in_flight += 1
            if before >= limit:
                w.refused_answer(now, before, 0.0, now)
                n += 1
                in_flight -= 1
                allowed = w.allowed(now)
            else:
                taken += 1
        assert w.floor <= w.allowed(now) and (w.ceiling is None or w.window <= w.ceiling)
        for _ in range(taken):
            w.answered(now + 1.0)
        refused.append(n)
    return refused


@settings(max_examples=60, deadline=None)
@given(limit=st.integers(1, 32), initial=st.integers(1, 128))
def test_window_finds_the_limit_and_429s_thin_out(limit, initial):
    w = AimdWindow(initial, probe_after=16)
    steps = 1200
    refused = drive(w, limit, steps)
    late = refused[steps // 2 :]
    # a failed probe draws one 429 (the first call over the limit), probes every
    # probe_after x 2^k answers: at most log2(answers / probe_after) + 1 of them late
    assert sum(late) <= math.log2(steps * limit / 16) + 2, (sum(refused), sum(late))
    assert w.allowed(float(steps)) <= limit + 1  # at most one over: a probe in progress
    assert w.allowed(float(steps)) >= max(1, limit // 2)  # and not stuck far below it


@settings(max_examples=40, deadline=None)
@given(limit=st.integers(1, 32), most=st.integers(1, 32))
def test_window_never_exceeds_what_the_caller_can_send(limit, most):
    w = AimdWindow(most, probe_after=8, most=most)
    drive(w, limit, 400)
    assert w.window <= most and w.allowed(400.0) <= most


def test_a_429_halves_the_window_each_cut_down_to_the_floor():
    """Exact values: 16 -> 8 on the first 429, -> 4 on the next (sent after that cut); a 429
    for a call sent before the last cut does not halve again; the floor holds."""
    w = AimdWindow(16, floor=3)
    # sent with 20 in flight: the ceiling (20) does not clamp, only the halving moves it
    w.refused_answer(sent_at=0.0, in_flight_before=20, retry_after_s=0.0, now=1.0)
    assert (w.window, w.allowed(1.0), w.cuts) == (8.0, 8, 1)
    w.refused_answer(sent_at=0.5, in_flight_before=20, retry_after_s=0.0, now=1.5)
    assert (w.window, w.cuts) == (8.0, 1)  # sent before the cut at 1.0: already answered
    w.refused_answer(sent_at=2.0, in_flight_before=20, retry_after_s=0.0, now=2.0)
    assert (w.window, w.allowed(2.0), w.cuts) == (4.0, 4, 2)
    w.refused_answer(sent_at=3.0, in_flight_before=20, retry_after_s=0.0, now=3.0)
    assert (w.window, w.allowed(3.0), w.cuts) == (3.0, 3, 3)  # 4 / 2 = 2, floored at 3
    w.refused_answer(sent_at=4.0, in_flight_before=20, retry_after_s=0.0, now=4.0)
    assert (w.window, w.allowed(4.0)) == (3.0, 3)


def test_a_429_halves_below_the_ceiling_it_sets():
    """A 429 heard with 10 in flight puts the ceiling at 10, and the window at half of it."""
    w = AimdWindow(32)
    w.refused_answer(sent_at=0.0, in_flight_before=10, retry_after_s=0.0, now=0.0)
    assert (w.ceiling, w.window, w.allowed(0.0)) == (10, 5.0, 5)
