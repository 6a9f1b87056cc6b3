"""docs/figures.md and the README's figures are what `tangram report` last wrote: each equals its
rendering of docs/figures.json (a hand edit to either fails here), every picture it names is
there, and the report's entries are the commands the report runs."""

import json
import os
import re
import subprocess
from pathlib import Path

from evaluation.report import (
    ENTRIES,
    commit,
    machine,
    readme_block,
    render_markdown,
    render_readme,
)

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.loads((ROOT / "docs" / "figures.json").read_text())


def test_figures_md_is_the_rendering_of_the_last_report():
    assert (ROOT / "docs" / "figures.md").read_text() == render_markdown(REPORT)


def test_readme_figures_are_the_rendering_of_the_last_report():
    block = readme_block((ROOT / "README.md").read_text())
    assert block is not None, "README.md has no figures block"
    assert block == render_readme(REPORT)


def test_every_readme_number_is_in_a_command_output():
    """Each number of the README's figures block was printed by its command (the JSON's
    output, verbatim): a number typed by hand is in no output."""
    block = readme_block((ROOT / "README.md").read_text())
    outputs = " ".join(d["output"] for d in REPORT["entries"])
    outputs += " ".join(_leaves(d["output"]) for d in REPORT["entries"])
    for row in block.splitlines():
        if not row.startswith("| ") or row.startswith(("| figure", "|---")):
            continue
        value = row.split(" | ")[1]
        for number in re.findall(r"\d+(?:\.\d+)?", value):
            assert number in outputs, (row, number)


def _leaves(text: str) -> str:
    """Every number of a JSON output as the report prints it (two decimals) and as it is."""
    try:
        doc = json.loads(text)
    except ValueError:
        return ""
    out, todo = [], [doc]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
        elif isinstance(x, int | float) and not isinstance(x, bool):
            out += [f"{x:.2f}", str(x)]
    return " ".join(out)


def test_every_entry_is_a_command_of_the_report_and_ran():
    names = {e.name for e in ENTRIES}
    assert {d["name"] for d in REPORT["entries"]} <= names
    for d in REPORT["entries"]:
        assert d["command"].startswith("tangram ")
        if d.get("image"):  # a generated plot: named, under the ignored folder
            assert d["image"] == f"img/figures/{d['name']}.png", d["image"]


def test_every_picture_the_docs_show_is_in_the_tree():
    """A fresh clone has every image README.md and docs/*.md embed (a `*.png` ignore rule
    once kept the README's picture out of the repository)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            assert (page.parent / target).is_file(), (page.name, target)


def _entry(name="fig6", rc=0, output="", **kw):
    return {
        "name": name,
        "title": "T",
        "command": f"tangram {name}",
        "date": "d",
        "wall_s": 1.0,
        "load_1min": 0.5,
        "rc": rc,
        "output": output,
        "error_tail": kw.pop("error_tail", ""),
        **kw,
    }


def _report(*entries, skipped=()):
    machine = {"cpu": "c", "cores": 2, "memory_gib": 1.0, "kernel": "k", "python": "3"}
    return {
        "machine": {**machine, "root": False},
        "commit": "abc",
        "generated": "g",
        "skipped": list(skipped),
        "entries": list(entries),
    }


def test_rendering_says_what_failed_what_was_skipped_and_empty_output():
    failed = _entry("exec", rc=2, error_tail="boom")
    empty = _entry("dparrange", output="")
    cells = {"metric": "a|b", "ours": 1.0, "paper": None, "unit": "x", "note": "n|m"}
    fig = _entry("fig6", output=json.dumps({"compare": [cells], "notes": []}))
    md = render_markdown(_report(fig, failed, empty, skipped=["twin", "env"]))
    assert "Not run by the last report (its budget): twin, env.\n" in md
    assert "`tangram exec` - d, 1.0 s, load 0.5, **exit 2**\n\n```text\nboom\n```\n" in md
    assert "`tangram dparrange` - d, 1.0 s, load 0.5\n\n```text\n(no output)\n```\n" in md
    assert "| a/b | 1.00x | - | n/m |" in md
    assert "Not run by" not in render_markdown(_report(fig))
    no_compare = _entry("fig6", output=json.dumps({"rows": []}))
    assert "| fig6" not in render_readme(_report(no_compare))


def test_the_readme_block_needs_both_marks():
    begin, end = "<!-- figures: tangram report -->", "<!-- /figures -->"
    assert readme_block(f"{begin}\nx\n{end}") == f"{begin}\nx\n{end}"
    assert readme_block(f"a\n{begin}\nx\n{end}\nb") == f"{begin}\nx\n{end}"
    assert readme_block(f"{begin}\nx\n") is None
    assert readme_block(f"x\n{end}") is None


def test_the_machine_and_commit_are_described_as_they_are():
    m = machine()
    assert "model name" not in m["cpu"] and ":" not in m["cpu"] and m["cpu"]
    total_kib = int(Path("/proc/meminfo").read_text().split()[1])  # MemTotal first
    assert abs(m["memory_gib"] - total_kib / 2**20) < 0.2
    assert m["root"] is (os.geteuid() == 0) and m["cores"] == os.cpu_count()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert commit() == (head.stdout.strip() or "unknown")
