"""The E(m) fit: data override the prior; a run that gets slower with more units is learned."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.actions import Action, Elasticity
from tangram.profiles import AmdahlFit, DurationProfiles, amdahl, amdahl_efficiency


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 0.9), st.floats(1.0, 100.0))
def test_fit_recovers_amdahl_from_noiseless_runs(serial, t_ori):
    fit = AmdahlFit(prior_serial=0.25, prior_t_ori=10.0)
    for _ in range(20):  # many observations outweigh the prior's two pseudo-observations
        for m in (1, 2, 4, 8):
            fit.add(m, t_ori * (serial + (1 - serial) / m))
    t, s = fit.params()
    assert t == pytest.approx(t_ori, rel=0.02)
    assert s == pytest.approx(serial, abs=0.02)


def test_prior_holds_without_data_and_one_run_only_rescales():
    fit = AmdahlFit(prior_serial=0.25, prior_t_ori=10.0)
    assert fit.params() == pytest.approx((10.0, 0.25))
    fit.add(2, 3.0)
    t, s = fit.params()
    assert s == pytest.approx(0.25)  # one amount tells nothing about the curve's shape
    assert fit.predict(2) == pytest.approx(3.0)


def test_slower_with_more_cores_is_learned():
    """The measured more-itertools case: 8.5 s on 1 core, 10.5 s with -n 2 on 2."""
    fit = AmdahlFit(prior_serial=0.25, prior_t_ori=10.0)
    for _ in range(5):
        fit.add(1, 8.5)
        fit.add(2, 10.5)
    assert fit.serial > 1.0
    assert fit.predict(2) > fit.predict(1)
    e = fit.efficiency()
    assert all(0 < e(m) <= 1 for m in (1, 2, 4, 8))


def test_profiles_feed_the_fit_from_fixed_and_elastic_runs():
    prof = DurationProfiles()
    fit = prof.speedup("exec:pytest", 0.25, 10.0, "cpu")
    el = Elasticity("cpu", 10.0, fit.efficiency())
    prof.observe(Action("a", {"cpu": [1, 2]}, elasticity=el, kind="exec:pytest"), {"cpu": 2}, 6)
    prof.observe(Action("b", {"cpu": 1}, kind="exec:pytest"), {"cpu": 1}, 8.0)
    prof.observe(Action("c", {"cpu": 1}, kind="other"), {"cpu": 1}, 1.0)
    assert list(fit.obs) == [(2, 6.0), (1, 8.0)]
    assert prof.speedup("exec:pytest", 0.5, 1.0) is fit


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.floats(0, 1), st.floats(0.01, 100), st.floats(0, 5))
def test_amdahl_has_one_formula_in_its_forms(m, serial, t_ori, spawn_s):
    """The one Amdahl: the closed forms the estimator, the workloads and the instance
    generators used before agree with it, and it stays in (0, 1]."""
    e = amdahl_efficiency(m, serial, t_ori, spawn_s)
    assert 0 < e <= 1
    want = t_ori / (m * (t_ori * (serial + (1 - serial) / m) + spawn_s * (m - 1)))
    assert e == pytest.approx(min(1.0, want), rel=1e-12)
    plain = amdahl_efficiency(m, serial)
    assert plain == pytest.approx(1 / (1 + serial * (m - 1)), rel=1e-12)
    assert plain == pytest.approx(1 / (m * serial + 1 - serial), rel=1e-12)
    assert amdahl(serial)(m) == plain
