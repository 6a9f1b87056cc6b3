"""The README's first program runs as written and prints what the README says it prints
(it opens a shell session, which needs the bwrap backend: root and bubblewrap)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from managers.cpu.backends.bwrap.backend import BwrapBackend

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_first_program_runs_as_written(tmp_path):
    why = BwrapBackend.probe()
    if why is not None:
        pytest.skip(f"bwrap backend unavailable: {why}")
    text = README.read_text()
    section = text[text.index("## A first program") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    program = tmp_path / "first.py"
    program.write_text(code)
    out = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, timeout=300, check=True
    ).stdout.splitlines()
    said = re.search(r"It prints `(.*?)` and `(.*?)`", section.replace("\n", " ")).groups()
    assert out[0].startswith(said[0].rsplit(" queued", 1)[0]) and "queued" in out[0], out
    assert out[1] == said[1], out
