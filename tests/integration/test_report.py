"""`tangram report`: runs its entries in child processes, writes figures.json, figures.md and the
README's block; an entry past the budget is not started and the last figures are kept; a
command that fails is kept with its status, and the report exits 1."""

import json
import subprocess

import pytest

from evaluation import report
from evaluation.report import BEGIN, END, Entry, main


def _readme(tmp_path):
    p = tmp_path / "README.md"
    p.write_text(f"# x\n\n{BEGIN}\n{END}\n\nafter\n")
    return p


def test_report_runs_an_entry_and_renders_it(tmp_path, capsys):
    readme = _readme(tmp_path)
    docs = tmp_path / "docs"
    argv = ["--only", "fig6", "--docs", str(docs), "--readme", str(readme)]
    assert main(argv) == 0
    doc = json.loads((docs / "figures.json").read_text())
    (fig6,) = doc["entries"]
    assert fig6["rc"] == 0 and (docs / "img" / "figures" / "fig6.png").is_file()
    md = (docs / "figures.md").read_text()
    assert "| coding: ACT (queue + run per action), baseline / Tangram |" in md
    assert "Its plot: `docs/img/figures/fig6.png` (written by `tangram report`" in md
    text = readme.read_text()
    assert "coding: rollout makespan" in text and text.endswith("\nafter\n")
    # past the budget: not started, the figures of the last report kept
    assert main(["--budget-min", "0.001", *argv]) == 0
    again = json.loads((docs / "figures.json").read_text())
    assert again["skipped"] == ["fig6"] and again["entries"] == doc["entries"]
    assert "Not run by the last report (its budget): fig6." in (docs / "figures.md").read_text()


def test_a_failing_command_is_kept_with_its_status(tmp_path, monkeypatch, capsys):
    bad = Entry("fig6", "broken", ("bench", "no-such-bench"), 1)
    monkeypatch.setattr(report, "ENTRIES", (bad,))
    argv = ["--docs", str(tmp_path), "--readme", str(tmp_path / "none.md")]
    assert main(argv) == 1
    (d,) = json.loads((tmp_path / "figures.json").read_text())["entries"]
    assert d["rc"] == 2 and "no-such-bench" in d["error_tail"]
    assert "**exit 2**" in (tmp_path / "figures.md").read_text()
    assert "fig6" in capsys.readouterr().err


def test_bad_budget_names_the_value(capsys):
    with pytest.raises(SystemExit):
        main(["--budget-min", "0"])
    assert "--budget-min 0.0: must be above 0" in capsys.readouterr().err


def test_a_command_past_the_budget_is_stopped_and_says_so(tmp_path, monkeypatch, capsys):
    slow = Entry("sessions", "slow", ("bench", "sessions"), 1)  # about 100 s here
    monkeypatch.setattr(report, "ENTRIES", (slow,))
    argv = ["--budget-min", "0.05", "--docs", str(tmp_path), "--readme", str(tmp_path / "x")]
    assert main(argv) == 1
    (d,) = json.loads((tmp_path / "figures.json").read_text())["entries"]
    assert d["rc"] == 124 and d["error_tail"].endswith("(stopped after 3 s: the budget)")
    assert d["wall_s"] < 30
    # nothing of it left: no process of the bench's group runs on
    left = subprocess.run(
        ["pgrep", "-f", "tangram.runtime.cli bench sessions"], capture_output=True
    )
    assert left.stdout == b"", left.stdout
