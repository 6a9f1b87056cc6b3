"""The AI-coding example, run as a user runs it: a real task image, a forked group of 8, the
project's own tests as the reward. Needs root, bwrap, overlayfs, loop devices and PyPI (or
pip's cache) for six's sdist and pytest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.layers import LayerStore, mounts_below

ROOT = Path(__file__).resolve().parents[2]


def _reason() -> str | None:
    why = BwrapBackend.probe()
    if why is None:
        with tempfile.TemporaryDirectory() as d:
            why = LayerStore(d).why_not
    if why is None:
        got = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                tempfile.gettempdir(),
                "six==1.17.0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if got.returncode != 0:
            why = f"PyPI unreachable for six's sdist: {got.stderr.strip()[-300:]}"
    return why


def test_example_rollout_rewards_fixes_and_only_fixes() -> None:
    why = _reason()
    if why is not None:
        pytest.skip(why)
    state = Path(tempfile.mkdtemp(prefix="tangram-rollout-test."))
    try:
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "ai_coding_rollout.py"),
                "--state-dir",
                str(state),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["base"]["reward"] == 0.0 and out["base"]["not_passed"] >= 1
        rewards = {s["patch"]: s["reward"] for s in out["samples"]}
        assert len(rewards) == 8
        assert {p for p, r in rewards.items() if r == 1.0} == {"fix", "fix-generator", "fix-copy"}
        assert all(s["passed"] > 100 for s in out["samples"] if s["patch"] != "syntax-error")
        assert mounts_below(state) == []
    finally:
        LayerStore(state).sweep()
        shutil.rmtree(state, ignore_errors=True)
