"""`tangram report [--budget-min M] [--only NAME ...] [--docs DIR] [--readme FILE]`: run the quick
experiments and the benches, and write what they printed as `docs/figures.md`.

Each entry of `ENTRIES` is one command. The report runs it in a child process (stdout not a
terminal, 140 columns, so a table is never cut), keeps its output as it came (an experiment's
JSON becomes a table of its figures beside the paper's, and its PNG is copied under
`docs/img/figures/`; a bench's printed table is kept verbatim), with the command, the machine,
the load, the date and the commit beside it. Everything lands in `docs/figures.json` first;
`docs/figures.md` and the figures block of the README are rendered from that file alone
(`render_markdown`, `render_readme`), so `tests/unit/test_figures_report.py` can check that
neither was edited by hand: each must equal its rendering of the JSON.

`--only NAME` reruns those entries and keeps the others from the last report (each entry says
its own date and machine). An entry that would not fit in what is left of `--budget-min` is not
started: the report says so and keeps its last figures, if any. An entry whose command fails
is kept with its exit status and the tail of its output, never silently dropped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.output import Steps

COLUMNS = 140


@dataclass(frozen=True)
class Entry:
    name: str
    title: str
    argv: tuple[str, ...]  # after `tangram`
    estimate_s: float  # what it took here, to plan the budget
    experiment: bool = False  # JSON on stdout and NAME.png under --out
    readme: tuple[str, ...] = ()  # output lines (regexes) the README quotes


EXPERIMENT_TITLES = {
    "fig6": "Fig. 6: ACT per workload against its baseline",
    "fig7": "Fig. 7: ACT per trajectory by part",
    "fig8-cpu": "Fig. 8 (CPU): scalability against Kubernetes",
    "fig8-gpu": "Fig. 8 (GPU): scalability against SGLang and ServerlessLLM",
    "fig9": "Fig. 9: elastic scheduling against fixed degrees of parallelism",
    "table1": "Table 1: ACT split into queueing, overhead and execution",
}

ENTRIES: tuple[Entry, ...] = (
    *(
        Entry(n, t, ("experiment", n, "--quick", "--no-range", "--json"), 8, experiment=True)
        for n, t in EXPERIMENT_TITLES.items()
    ),
    Entry(
        "simulator",
        "The simulator: AI coding at batch 2,048 on 15 x 256 cores",
        ("experiment", "bench", "--json"),
        40,
    ),
    Entry("dparrange", "DPArrange's time", ("bench", "dparrange"), 5),
    Entry("scheduler", "The scheduler's decision time", ("bench", "scheduler"), 15),
    Entry(
        "exec",
        "Exec overhead per CPU backend",
        ("bench", "exec"),
        35,
        readme=(
            r"^raw subprocess",
            r"^bwrap action, same grant",
            r"^bwrap rootless action, same grant",
        ),
    ),
    Entry(
        "runtime", "The runtime's throughput, in process and over HTTP", ("bench", "runtime"), 40
    ),
    Entry(
        "sandboxfusion",
        "/run_code latency against a minimal server",
        ("bench", "sandboxfusion", "--latency"),
        90,
        readme=(r"^rootless vs root \(tangram\)",),
    ),
    Entry("sessions", "Shell sessions against swerex-remote", ("bench", "sessions"), 120),
    Entry("env", "Environments from images, fork and snapshot", ("bench", "env"), 60),
    Entry(
        "scale",
        "The scheduler's CPU at 2,048 and 16,384 trajectories, one process and sharded",
        ("bench", "scale", "--sizes", "2048", "16384", "--workloads", "coding"),
        300,
        readme=(r"at batch 16,384: sharded, busiest process",),
    ),
    Entry("twin", "The digital twin against a real run", ("experiment", "twin", "--quick"), 240),
)
README_EXPERIMENTS = {"fig6": ("coding:", "mopd: ACT (")}  # figures quoted in the README


# -- running ------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (OSError, ValueError):
        mem_gib = 0.0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
    }


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_entry(e: Entry, timeout_s: float, images: Path) -> dict[str, Any]:
    """Run one entry's command; what it printed, its status and its PNG."""
    env = {**os.environ, "COLUMNS": str(COLUMNS), "TERM": "dumb", "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory(prefix="tangram-report-") as out:
        argv = [*e.argv, "--out", out] if e.experiment else list(e.argv)
        cmd = [sys.executable, "-m", "tangram.runtime.cli", *argv]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        rc, stdout, stderr = _run(cmd, env, timeout_s)
        doc: dict[str, Any] = {
            "name": e.name,
            "title": e.title,
            "command": "tangram " + " ".join(e.argv),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": round(time.perf_counter() - t0, 1),
            "load_1min": round(load, 2),
            "rc": rc,
            "output": stdout.rstrip("\n"),
            "error_tail": "\n".join(stderr.strip().splitlines()[-15:]) if rc else "",
        }
        png = Path(out) / f"{e.name}.png"
        if rc == 0 and e.experiment and png.exists():
            images.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, images / png.name)
            doc["image"] = f"img/figures/{png.name}"
    return doc


def _run(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); past `timeout_s` its whole process group is killed
    (a bench's servers and sandboxes too, not only the child) and the status is 124."""
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout_s)
        return p.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        return 124, stdout, stderr + f"\n(stopped after {timeout_s:.0f} s: the budget)"
    finally:
        if p.poll() is None:  # interrupted (Ctrl-C): nothing of it stays
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_report(
    entries: list[Entry], budget_s: float, images: Path, previous: dict[str, Any]
) -> dict[str, Any]:
    """Run `entries` within `budget_s`, keeping the previous report's other entries."""
    kept = {d["name"]: d for d in previous.get("entries", [])}
    t0 = time.perf_counter()
    skipped = []
    with Steps(len(entries), "report") as steps:
        for e in entries:
            left = budget_s - (time.perf_counter() - t0)
            if e.estimate_s > left:
                skipped.append(e.name)
                steps.advance(f"{e.name}: not started ({left:.0f} s of the budget left)")
                continue
            steps.describe(e.name)
            kept[e.name] = run_entry(e, max(left, e.estimate_s), images)
            steps.advance(f"{e.name}: exit {kept[e.name]['rc']}")
    order = [e.name for e in ENTRIES]
    return {
        "machine": machine(),
        "commit": commit(),
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "skipped": skipped,
        "entries": sorted(kept.values(), key=lambda d: order.index(d["name"])),
    }


# -- rendering ----------------------------------------------------------------------------------
HEADER = """# Figures

Written by `tangram report` from `figures.json`; do not edit by hand (a test renders the JSON
again and compares). Each section is one command's output as it printed it, with the command,
the date, the commit, the machine's load and the wall time beside it. Rerun one with
`tangram report --only NAME`; what the figures mean, and the runs behind them over time, are in
[findings.md](findings.md).
"""


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        HEADER,
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}{', as root' if m['root'] else ''}; "
        f"report of {report['generated']} at commit `{report['commit']}`.",
        "",
    ]
    if report.get("skipped"):
        lines += [f"Not run by the last report (its budget): {', '.join(report['skipped'])}.", ""]
    for d in report["entries"]:
        lines += _section(d)
    return "\n".join(lines).rstrip("\n") + "\n"


def _section(d: dict[str, Any]) -> list[str]:
    out = [
        f"## {d['title']}",
        "",
        f"`{d['command']}` - {d['date']}, {d['wall_s']} s, load {d['load_1min']}"
        + ("" if d["rc"] == 0 else f", **exit {d['rc']}**"),
        "",
    ]
    if d["rc"] != 0:
        return out + ["```text", d["error_tail"] or "(no output)", "```", ""]
    doc = _json(d["output"])
    if doc is not None and "compare" in doc:
        out += _compare_table(doc)
    else:
        out += ["```text", d["output"] or "(no output)", "```", ""]
    if d.get("image"):  # generated, so not in the repository: the report writes it here
        out += [f"Its plot: `docs/{d['image']}` (written by `tangram report`, not committed).", ""]
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _fmt(v: Any, unit: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


def _compare_table(doc: dict[str, Any]) -> list[str]:
    out = ["| figure | ours | paper | note |", "|---|---|---|---|"]
    for c in doc["compare"]:
        cells = (c["metric"], _fmt(c["ours"], c["unit"]), _fmt(c["paper"], c["unit"]), c["note"])
        out.append("| " + " | ".join(str(x).replace("|", "/") for x in cells) + " |")
    out.append("")
    out += [f"- {n}" for n in doc.get("notes", [])]
    return out + ([""] if doc.get("notes") else [])


BEGIN, END = "<!-- figures: tangram report -->", "<!-- /figures -->"


def render_readme(report: dict[str, Any]) -> str:
    """The README's block of figures: a few lines quoted from the report's entries."""
    by = {d["name"]: d for d in report["entries"] if d["rc"] == 0}
    lines = [BEGIN, "| figure | value | command |", "|---|---|---|"]
    for name, starts in README_EXPERIMENTS.items():
        doc = _json(by[name]["output"]) if name in by else None
        for c in (doc or {}).get("compare", []):
            if c["metric"].startswith(starts) and c["ours"] is not None:
                lines.append(
                    f"| {c['metric']} | {_fmt(c['ours'], c['unit'])} | `{by[name]['command']}` |"
                )
    for e in ENTRIES:
        for pattern in e.readme:
            for line in by[e.name]["output"].splitlines() if e.name in by else []:
                if re.search(pattern, line):
                    label, *value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
                    lines.append(f"| {label} | {' '.join(value)} | `{by[e.name]['command']}` |")
    first = min((by[n]["date"] for n in by), default=report["generated"])
    lines.append("")
    lines.append(
        f"*From `tangram report` ({first} to {report['generated']}, {report['machine']['cores']} "
        f"cores); every table: [docs/figures.md](docs/figures.md).*"
    )
    return "\n".join(lines + [END])


def readme_block(text: str) -> str | None:
    i, j = text.find(BEGIN), text.find(END)
    return None if i < 0 or j < 0 else text[i : j + len(END)]


# -- the command --------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--budget-min", type=float, default=15.0, help="time budget (default 15)")
    p.add_argument(
        "--only", nargs="+", choices=[e.name for e in ENTRIES], help="rerun only these entries"
    )
    p.add_argument("--docs", default="docs", help="where figures.json/.md go (default docs)")
    p.add_argument("--readme", default="README.md", help="the README whose block is rewritten")
    return p


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    if ns.budget_min <= 0:
        _parser().error(f"--budget-min {ns.budget_min}: must be above 0")
    docs = Path(ns.docs)
    docs.mkdir(parents=True, exist_ok=True)
    path = docs / "figures.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    entries = [e for e in ENTRIES if not ns.only or e.name in ns.only]
    report = run_report(entries, ns.budget_min * 60, docs / "img" / "figures", previous)
    path.write_text(json.dumps(report, indent=1) + "\n")
    (docs / "figures.md").write_text(render_markdown(report))
    readme = Path(ns.readme)
    text = readme.read_text() if readme.exists() else ""
    block = readme_block(text)
    if block is not None:
        readme.write_text(text.replace(block, render_readme(report)))
    failed = [d["name"] for d in report["entries"] if d["rc"] != 0]
    print(f"wrote {path}, {docs / 'figures.md'}" + (f"; {readme}" if block else ""))
    if failed:
        print(f"failed (kept with their exit status): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
