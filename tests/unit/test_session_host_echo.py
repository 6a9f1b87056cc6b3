"""The session host's shell on its terminal.

Echo stays off across an interrupted command (a CI failure: after a `sleep 30` timed out, the
next command's output began with the line the host typed, `. /tmp/.tangram-sessions/s-....cmd;
printf ...`). bash keeps the terminal's settings as it found them at start and restores them
after a job is killed by a signal. The host used to turn echo off from its side after
`pty.fork`; when bash started first (a loaded machine), it kept echo on, and the first
interrupt turned it back on. And a child that cannot start bash exits rather than run on in
the host's code. Real components: `host.Shell` with a real bash on a real pseudo-terminal; the
host's side of the fork is slowed so that bash always starts first."""

from __future__ import annotations

import pty
import time

import pytest

from managers.cpu.sessions import host


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "SOCKET_DIR", str(tmp_path))
    real = pty.fork

    def bash_first():
        pid, fd = real()
        if pid != 0:
            time.sleep(0.5)  # the host's side late: bash has read the terminal's settings
        return pid, fd

    monkeypatch.setattr(pty, "fork", bash_first)
    sh = host.Shell("t", "bash")
    yield sh
    sh.kill()


def test_the_command_after_an_interrupt_prints_only_its_output(shell):
    assert shell.run({"command": "echo one", "timeout": 10})["output"] == "one\n"
    timed = shell.run({"command": "sleep 30", "timeout": 0.5})
    assert timed["ok"] and timed["timed_out"]
    after = shell.run({"command": "echo alive", "timeout": 10})
    assert after["output"] == "alive\n" and after["exit_code"] == 0


def test_a_shell_that_cannot_start_is_reported_dead_and_its_child_exits(tmp_path, monkeypatch):
    """The forked child never returns into the host's code: no bash, it exits with 127 and
    the session says so."""
    monkeypatch.setattr(host, "SOCKET_DIR", str(tmp_path))
    sh = host.Shell("t", str(tmp_path / "no-bash"))
    assert sh.dead == "the shell exited with code 127"
    assert sh.run({"command": "echo x", "timeout": 1}) == {"ok": False, "dead": sh.dead}
