"""The suite's shared helpers (`grammar`: strategies from the instance format) import by name
from every test folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# A hypothesis profile for runs that repeat the suite many times (evaluation/mutation.py runs
# it once per mutant): `HYPOTHESIS_PROFILE=mutation` draws the same few examples every run
# (derandomized, no example database) and caps every test's own `max_examples` and
# `stateful_step_count` too (a profile alone only sets the defaults a test's @settings
# overrides). TANGRAM_HYPOTHESIS_EXAMPLES sets the cap (default 20).
import os

from hypothesis import HealthCheck, settings

_CAP = int(os.environ.get("TANGRAM_HYPOTHESIS_EXAMPLES", "20"))
settings.register_profile(
    "mutation",
    max_examples=_CAP,
    stateful_step_count=_CAP,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def _capped(s: settings) -> settings:
    return settings(
        s,
        max_examples=min(s.max_examples, _CAP),
        stateful_step_count=min(s.stateful_step_count, _CAP),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


def pytest_collection_modifyitems(items) -> None:
    if os.environ.get("HYPOTHESIS_PROFILE") != "mutation":
        return
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is not None and getattr(fn, "is_hypothesis_test", False):
            fn._hypothesis_internal_use_settings = _capped(own)
        cls = getattr(item, "cls", None)
        if isinstance(getattr(cls, "settings", None), settings):  # a state machine's TestCase
            cls.settings = _capped(cls.settings)
