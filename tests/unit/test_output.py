"""`evaluation.output`: progress that is never silent off a terminal, and tables that no width
cuts (CSV off a terminal, folded cells on one)."""

import csv
import io
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


def test_quiet_steps_print_nothing():
    out = io.StringIO()
    with Steps(2, "work", quiet=True, stream=out) as s:
        s.advance("a")
        s.advance("b")
    assert out.getvalue() == "" and s.done == 2


def test_steps_on_a_terminal_draw_a_bar_and_leave_no_line():
    out = Tty()
    with Steps(2, "work", stream=out) as s:
        s.advance("a")
        s.advance("b")
    assert "[work] 1/2" not in out.getvalue()


def test_table_off_a_terminal_is_csv_with_every_cell_whole():
    out = io.StringIO()
    long = "x" * 300 + ", with a comma"
    show_table("t", ["figure", "value"], [[long, 1.5], ["b", "c"]], stream=out)
    title, *rest = out.getvalue().splitlines()
    assert title == "# t"
    assert list(csv.reader(rest)) == [["figure", "value"], [long, "1.5"], ["b", "c"]]


def test_table_on_a_terminal_fits_its_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    out = Tty()
    show_table("t", ["figure", "value"], [["word " * 60, "1.5"]], stream=out)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # colours are not width
    assert "figure" in text and "1.5" in text and text.count("word") == 60
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
