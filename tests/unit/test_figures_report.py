"""docs/figures.md and the README's figures are what `tangram report` last wrote: each equals its
rendering of docs/figures.json (a hand edit to either fails here), every picture it names is
there, and the report's entries are the commands the report runs."""

import json
import re
from pathlib import Path

from evaluation.report import ENTRIES, readme_block, render_markdown, render_readme

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
        if d.get("image"):
            assert (ROOT / "docs" / d["image"]).is_file(), d["image"]


def test_every_picture_the_docs_show_is_in_the_tree():
    """A fresh clone has every image README.md and docs/*.md embed (a `*.png` ignore rule
    once kept the README's picture out of the repository)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            assert (page.parent / target).is_file(), (page.name, target)
