"""`evaluation.output`: progress that is never silent off a terminal, and tables that no width
cuts (CSV off a terminal, folded cells on one)."""

import csv
import io
import os
import re
import time

from evaluation.output import Heartbeat, Steps, show_table


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_steps_print_a_line_per_step_off_a_terminal():
    out = io.StringIO()
    with Steps(3, "work", stream=out) as s:
        for name in ("a", "b", "c"):
            s.describe(name)
            s.advance(name)
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "[work] 1/3 a",
        "[work] 2/3 b",
        "[work] 3/3 c",
    ]
    assert all(line.endswith(" s)") for line in lines)
    assert all(0 <= float(line.split(" (")[1][:-3]) < 60 for line in lines)  # elapsed


def test_quiet_steps_print_nothing():
    out = io.StringIO()
    with Steps(2, "work", quiet=True, stream=out) as s:
        s.advance("a")
        s.advance("b")
    assert out.getvalue() == "" and s.done == 2


def test_steps_on_a_terminal_draw_a_bar_and_leave_no_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out = Tty()
    with Steps(2, "work", stream=out) as s:
        s.describe("first")
        s.advance("a")
        s.describe("second")
        s.advance("b")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "[work] 1/2" not in text  # no log line on a terminal: the bar
    assert "work: second" in text and "2/2" in text and "0:00:0" in text  # its columns
    assert "━" in text and "XX" not in text and "None" not in text  # a bar, the label as is
    assert out.getvalue().rstrip("\n").endswith("\x1b[2K")  # transient: the bar erased
    assert s._bar is None


def test_table_off_a_terminal_is_csv_with_every_cell_whole():
    out = io.StringIO()
    long = "x" * 300 + ", with a comma"
    show_table("t", ["figure", "value"], [[long, 1.5], ["b", "c"]], stream=out)
    assert "\r" not in out.getvalue()
    title, *rest = out.getvalue().splitlines()
    assert title == "# t"
    assert list(csv.reader(rest)) == [["figure", "value"], [long, "1.5"], ["b", "c"]]


def test_table_on_a_terminal_fits_its_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    out = Tty()
    token = "abcdefghij" * 12  # longer than a line: folded, never cut
    show_table("the title", ["figure", "value"], [["word " * 60, "1.5"], [token, "x"]], stream=out)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # colours are not width
    assert "the title" in text and "figure" in text and "1.5" in text
    first = "".join(line.split("│")[1].strip() for line in text.splitlines() if "│" in line)
    assert text.count("word") == 60 and token in first.replace("word", "")
    assert max(len(line) for line in text.splitlines()) <= 60


def test_heartbeat_says_it_is_alive_until_the_body_ends():
    out = io.StringIO()
    with Heartbeat("bench x", every_s=0.02, stream=out) as hb:
        deadline = time.monotonic() + 10
        while hb.beats < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    n = hb.beats
    time.sleep(0.06)
    lines = out.getvalue().splitlines()
    assert n >= 2 and hb.beats == n == len(lines)  # none after the body ended
    assert all(line.startswith("[bench x] running, ") for line in lines)
    assert all(0 <= float(line.split(", ")[1][:-2]) < 60 for line in lines)


def _pipe():
    r, w = os.pipe()
    os.set_blocking(r, False)
    return r, os.fdopen(w, "w")  # buffered: a line reaches the reader only when flushed


def test_a_progress_line_reaches_a_pipe_at_once():
    """A CI log (a pipe) sees each line while the command runs, not at its end."""
    r, w = _pipe()
    with Steps(2, "work", stream=w) as s:
        s.advance()
        assert os.read(r, 1000).decode().startswith("[work] 1/2 (")  # no name: none printed
    hb = Heartbeat("bench x", every_s=0.02, stream=w)
    with hb:
        deadline = time.monotonic() + 10
        while hb.beats < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.01)
        assert os.read(r, 1000).decode().startswith("[bench x] running, ")
    w.close()
    os.close(r)


def test_defaults_are_stderr_for_progress_and_stdout_for_tables(capsys):
    with Steps(1, "work") as s:
        s.advance("a")
    with Heartbeat("hb", every_s=0.01) as hb:
        deadline = time.monotonic() + 10
        while hb.beats < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    show_table("t", ["a"], [[1]])
    got = capsys.readouterr()
    assert got.err.startswith("[work] 1/1 a (") and "[hb] running, " in got.err
    assert got.out == "# t\na\n1\n"


class Plain:
    """A stream with no isatty (some wrappers): not a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)


def test_a_stream_without_isatty_gets_csv():
    out = Plain()
    show_table("t", ["a", "b"], [[1, 2]], stream=out)
    assert out.text == "# t\na,b\n1,2\n"
