"""`files.openat2` under renames elsewhere on the host (CI failure at stop 47).

With `RESOLVE_IN_ROOT` the kernel fails a resolution through `..` with EAGAIN whenever any
rename or mount on the host happened meanwhile (it cannot prove the walk stayed inside);
openat2(2) says to try again. A parallel test renaming files made a tar of `/sandbox/up/etc`
(`up` a link to `..`) fail with "Resource temporarily unavailable". Real components: the
syscall, and a second process renaming a file as fast as it can."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from managers.cpu import files

WALK = "a/b/../../a/up/etc"  # `..` twice, and a planted link to `..`


@pytest.fixture
def renamer(tmp_path):
    a, b = tmp_path / "x", tmp_path / "y"
    a.touch()
    swap = f"os.rename({str(a)!r}, {str(b)!r}); os.rename({str(b)!r}, {str(a)!r})"
    loop = f"import os\nwhile True:\n    {swap}\n"
    proc = subprocess.Popen([sys.executable, "-c", loop])
    time.sleep(0.3)  # let it start renaming
    yield proc
    proc.kill()
    proc.wait()


def _tree(tmp_path) -> int:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "marker").touch()
    os.symlink("..", root / "a" / "up")
    return os.open(root, os.O_PATH | os.O_DIRECTORY)


def _walks(rootfd: int, n: int) -> int:
    done = 0
    for _ in range(n):
        fd = files.openat2(rootfd, WALK, os.O_PATH | os.O_DIRECTORY)
        assert os.path.exists(f"/proc/self/fd/{fd}/marker")
        os.close(fd)
        done += 1
    return done


def test_a_walk_through_dotdot_survives_renames_elsewhere(tmp_path, renamer):
    rootfd = _tree(tmp_path)
    try:
        assert _walks(rootfd, 20_000) == 20_000
    finally:
        os.close(rootfd)


def test_the_race_is_real_here_with_one_try(tmp_path, renamer, monkeypatch):
    """The other half: with a single try the same walks do meet EAGAIN, so the test above
    exercises the retry (on a kernel that never races, this one is skipped, not passed)."""
    monkeypatch.setattr(files, "RETRIES", 1)
    rootfd = _tree(tmp_path)
    spoiled = 0
    try:
        for _ in range(20):
            try:
                _walks(rootfd, 10_000)
            except OSError as exc:
                assert exc.errno == errno.EAGAIN
                spoiled += 1
    finally:
        os.close(rootfd)
    if not spoiled:
        pytest.skip("no EAGAIN in 200,000 walks on this kernel")


def test_a_persistent_race_ends_in_an_error_not_a_hang(monkeypatch, tmp_path):
    """The retries are bounded: a resolution spoiled every time fails with EAGAIN."""
    calls = []

    def always_eagain(*args):
        calls.append(1)
        files.ctypes.set_errno(errno.EAGAIN)
        return -1

    monkeypatch.setattr(files._libc, "syscall", always_eagain)
    with pytest.raises(OSError) as err:
        files.openat2(0, "x", os.O_PATH)
    assert err.value.errno == errno.EAGAIN and len(calls) == files.RETRIES
