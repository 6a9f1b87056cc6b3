"""Issue 22, finding 7 (the pure part): the profile key of an exec comes from the trusted
caller's kind, or is the trajectory's own; profiles stay bounded in memory, and a mean does not
depend on the order of completions."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tangram.actions import Action
from tangram.errors import ValidationError
from tangram.profiles import FIT_WINDOW, MAX_KINDS, AmdahlFit, DurationProfiles, exec_kind

names = st.text(min_size=1, max_size=20)
commands = st.one_of(
    st.text(max_size=40), st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=4)
)


@given(names, names, commands, commands)
@example("x@y", "y", "w", "w@x")  # a separator inside a name must not make two keys one
def test_without_a_kind_no_two_trajectories_share_a_key(a, b, ca, cb):
    if a != b:
        assert exec_kind(a, ca) != exec_kind(b, cb)


@given(
    names,
    names,
    commands,
    commands,
    st.text(min_size=1, max_size=30).filter(
        lambda k: not any(ord(c) < 32 or ord(c) == 127 for c in k)
    ),
)
def test_a_trusted_kind_is_shared_and_never_collides_with_a_commands_word(a, b, ca, cb, kind):
    assert exec_kind(a, ca, kind) == exec_kind(b, cb, kind)
    assert exec_kind(a, ca, kind) != exec_kind(a, ca)


@pytest.mark.parametrize("kind", ["", "a\nb", "x" * 129, 3])
def test_a_bad_kind_names_its_field(kind):
    with pytest.raises(ValidationError, match="exec.kind"):
        exec_kind("t", "echo", kind)


def test_a_fit_keeps_a_window():
    fit = AmdahlFit(0.25, 10.0)
    for i in range(10 * FIT_WINDOW):
        fit.add(1 + i % 4, 1.0 + i % 3)
    assert len(fit.obs) == FIT_WINDOW


def test_profiles_keep_at_most_max_kinds():
    prof = DurationProfiles()
    for i in range(MAX_KINDS + 500):
        prof.observe(Action(f"a{i}", {"cpu": 1}, kind=f"k{i}"), {"cpu": 1}, 1.0)
        prof.speedup(f"k{i}", 0.25, 1.0)
    assert len(prof._run) == MAX_KINDS and len(prof._fits) == MAX_KINDS
    assert prof.mean(f"k{MAX_KINDS + 499}") == 1.0 and prof.mean("k0") is None


@given(st.lists(st.floats(0.001, 1e4), min_size=1, max_size=400), st.randoms())
def test_a_mean_stays_within_what_was_seen_whatever_the_order(xs, rnd):
    means = []
    for order in (xs, rnd.sample(xs, len(xs))):
        prof = DurationProfiles()
        for i, x in enumerate(order):
            prof.observe(Action(f"a{i}", {"cpu": 1}, kind="k"), {"cpu": 1}, x)
        means.append(prof.mean("k"))
    assert min(xs) * (1 - 1e-9) <= means[0] <= max(xs) * (1 + 1e-9)
    assert abs(means[0] - means[1]) <= 1e-9 * max(xs)
