"""SWE-ReX's `execute` command line (`tangram/runtime/http/swerex.py`): a command that cannot
be split is a ValueError for SWE-ReX's client (found by the schema fuzzer: it was a 500), and
what the line does for each of `shell`, `env`, `cwd`, `merge_output_streams`."""

from __future__ import annotations

import io
import subprocess
import zipfile

import pytest

from tangram.errors import ValidationError
from tangram.runtime.http import swerex
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


def test_an_upload_is_bounded_in_files_and_bytes_before_anything_unpacks(monkeypatch):
    def zipped(n: int, size: int) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for i in range(n):
                z.writestr(f"d/f{i}", b"x" * size)
        return out.getvalue()

    assert set(swerex._unzipped(zipped(3, 2), "/sandbox/t")) == {
        f"/sandbox/t/d/f{i}" for i in range(3)
    }
    monkeypatch.setattr(swerex, "UPLOAD_FILES", 2)
    with pytest.raises(ValidationError, match="holds 3 files, over 2"):
        swerex._unzipped(zipped(3, 2), "/t")
    monkeypatch.setattr(swerex, "UPLOAD_MAX", 5)
    with pytest.raises(ValidationError, match="unpacks past 5 bytes"):
        swerex._unzipped(zipped(2, 3), "/t")
    with pytest.raises(ValidationError, match="not a zip archive"):
        swerex._unzipped(b"not a zip", "/t")
