"""SWE-ReX's `execute` command line (`tangram/runtime/http/swerex.py`): a command that cannot
be split is a ValueError for SWE-ReX's client (found by the schema fuzzer: it was a 500), and
what the line does for each of `shell`, `env`, `cwd`, `merge_output_streams`."""

from __future__ import annotations

import subprocess

import pytest

from tangram.errors import ValidationError
from tangram.runtime.http.swerex import Command, _command_line


def test_a_command_that_cannot_be_split_names_it():
    with pytest.raises(ValidationError, match="cannot be split"):
        _command_line(Command(command="echo \\"))


@pytest.mark.parametrize(
    ("kw", "out"),
    [
        ({"command": "echo a b"}, "a b\n"),
        ({"command": ["printf", "%s|", "x y", "z"]}, "x y|z|"),
        ({"command": "echo $((1 + 2))", "shell": True}, "3\n"),
        ({"command": "pwd", "cwd": "/"}, "/\n"),
        ({"command": "echo $V", "shell": True, "env": {"V": "set"}}, "set\n"),
        ({"command": "echo e >&2", "shell": True, "merge_output_streams": True}, "e\n"),
    ],
)
def test_the_line_runs_as_subprocess_run_would(kw, out):
    line = _command_line(Command(**kw))
    got = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert got.stdout == out, (line, got)
