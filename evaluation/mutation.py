"""Mutation testing of the core mechanisms: `mutmut` (3.x) over one module at a time,
against the fast tests that exercise it, with a table of scores per module (docs/mutation.md).

    python -m evaluation.mutation                          # every module below, in turn
    python -m evaluation.mutation --module tangram/pools.py --module solvers/minimal.py
    python -m evaluation.mutation --module tangram/pools.py --tests tests/unit/test_fcfs.py
    python -m evaluation.mutation --module tangram/scheduler.py --sample 3   # every 3rd mutant
    python -m evaluation.mutation --list                    # the modules and their tests

mutmut 3 reads its configuration only from ./pyproject.toml (`[tool.mutmut]`) and keeps its
state in ./mutants/, so each module runs in a work folder of its own, `.mutation/<module>/`
(git-ignored): a fresh copy of the packages and tests (a snapshot: edits made meanwhile do not
leak in) with a pyproject.toml that holds the repository's pytest options and that module's
`[tool.mutmut]`. The folder is made anew on every run (so no earlier state can break it), and
is left behind so a survivor can be read:

    cd .mutation/tangram.pools && ../../.venv/bin/mutmut show tangram.pools.x_free__mutmut_3

The tests run under the hypothesis profile `mutation` (tests/conftest.py: the same few examples
every run, every test's max_examples capped), so a verdict is the same on every run. Each
module's survivors are written, with their diffs, to `.mutation/<module>/survivors.txt`; the
table to `.mutation/scores.md` and `.mutation/scores.json` (merged with earlier runs' rows; a
run with --only, a check of a few mutants by name, is printed and not kept there).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
PACKAGES = ("tangram", "solvers", "managers", "topology", "evaluation")
COPIED = (*PACKAGES, "tests")

# The fast tests that exercise each module: unit and property tests that need no Docker, bwrap,
# Ray or GPU. mutmut records which of them reach each mutated function and runs only those per
# mutant, so a list may be generous; each entry is a path or a node id.
_SCHED = [
    "tests/unit/test_liveness.py",
    "tests/unit/test_fcfs.py",
    "tests/property/test_scheduler.py",
    "tests/property/test_liveness_stateful.py",
    "tests/property/test_conservation.py",
]
TESTS: dict[str, list[str]] = {
    "evaluation/output.py": ["tests/unit/test_output.py"],
    "evaluation/report.py": [
        "tests/unit/test_figures_report.py",
        "tests/integration/test_report.py",
    ],
    "tangram/trace.py": [
        "tests/unit/test_trace.py",
        "tests/property/test_trace_grammar.py",
        "tests/unit/test_mutation_kills_trace.py",
    ],
    "managers/cpu/environments.py": [
        "tests/unit/test_environment_owner.py",
        "tests/unit/test_env_disk.py",
        "tests/unit/test_bindings.py",
        "tests/unit/test_mutation_kills_environments.py",
    ],
    "tangram/liveness.py": [
        "tests/unit/test_liveness.py",
        "tests/property/test_liveness_stateful.py",
        "tests/property/test_conservation.py",
        "tests/unit/test_mutation_kills_liveness.py",
    ],
    "solvers/minimal.py": [
        "tests/unit/test_fcfs.py",
        "tests/unit/test_registry.py",
        "tests/property/test_conservation.py",
        "tests/property/test_scheduler.py",
        "tests/unit/test_mutation_kills_policies.py",
    ],
    "managers/flow.py": [
        "tests/property/test_flow_window.py",
        "tests/unit/test_basic_manager.py",
        "tests/unit/test_mutation_kills_flow.py",
    ],
    "tangram/pools.py": [
        *_SCHED,
        "tests/property/test_chunktree.py",
        "tests/property/test_gpu_properties.py",
        "tests/unit/test_bindings.py",
        "tests/unit/test_gpu_residency.py",
        "tests/unit/test_mutation_kills_pools.py",
    ],
    "tangram/conservation.py": [
        "tests/property/test_conservation.py",
        "tests/property/test_liveness_stateful.py",
        "tests/unit/test_liveness.py",
        "tests/unit/test_mutation_kills_conservation.py",
    ],
    "solvers/heuristic/dparrange.py": [
        "tests/property/test_dparrange.py",
        "tests/unit/test_exact_arrangement.py",
        "tests/property/test_scheduler.py",
        "tests/unit/test_mutation_kills_dparrange.py",
    ],
    "solvers/heuristic/putoff.py": [
        "tests/unit/test_rereads.py",
        "tests/property/test_scheduler.py",
        "tests/property/test_conservation.py",
        "tests/unit/test_decision_replay.py",
    ],
    "solvers/fcfs.py": [
        *_SCHED,
        "tests/property/test_queue_equivalence.py",
        "tests/unit/test_decision_replay.py",
        "tests/unit/test_mutation_kills_policies.py",
    ],
    "tangram/scheduler.py": [
        *_SCHED,
        "tests/unit/test_rereads.py",
        "tests/unit/test_decision_replay.py",
        "tests/unit/test_mutation_kills_scheduler.py",
    ],
    "solvers/heuristic/policy.py": [
        *_SCHED,
        "tests/unit/test_decision_replay.py",
        "tests/unit/test_rereads.py",
        "tests/test_scenarios.py::test_scenario",
        "tests/property/test_grammar.py",
        "tests/property/test_queue_equivalence.py",
        "tests/unit/test_mutation_kills_heuristic.py",
    ],
    "solvers/heuristic/backfill.py": [
        "tests/property/test_backfill.py",
        "tests/property/test_grammar.py",
        "tests/unit/test_mutation_kills_heuristic.py",
        "tests/property/test_conservation.py",
        "tests/unit/test_decision_replay.py",
        "tests/test_scenarios.py::test_scenario",
    ],
    "tangram/queue.py": [
        *_SCHED,
        "tests/property/test_queue_equivalence.py",
        "tests/unit/test_mutation_kills_policies.py",
        "tests/unit/test_rereads.py",
        "tests/unit/test_mutation_kills_queue.py",
    ],
    "tangram/runtime/shards/worker.py": [
        "tests/unit/test_shards.py",
        "tests/unit/test_shards_config.py",
        "tests/property/test_shards_stateful.py",
    ],
    "tangram/runtime/shards/batches.py": [
        "tests/unit/test_shard_batch_stepper.py",
        "tests/unit/test_shard_batches.py",
    ],
    "tangram/runtime/shards/router.py": [
        "tests/unit/test_shards.py",
        "tests/unit/test_shards_config.py",
        "tests/property/test_shards_stateful.py",
    ],
}

# mutmut's exit codes by verdict (mutmut.stats.status_by_exit_code), gathered into the table's
# columns; a mutant no selected test reaches ("no tests") counts against the score.
COLUMNS = ("killed", "survived", "no tests", "timeout", "suspicious")


@dataclass
class Row:
    module: str
    mutants: int  # in the module
    run: int  # of them run (all, or every k-th when sampled)
    killed: int
    survived: int
    no_tests: int
    timeout: int
    suspicious: int
    sample: int  # k: every k-th mutant by name (1: all)
    seconds: float
    command: str

    @property
    def checked(self) -> int:
        return self.killed + self.survived + self.no_tests + self.timeout + self.suspicious

    @property
    def score(self) -> float:
        return 100.0 * (self.killed + self.timeout) / self.checked if self.checked else 0.0


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def pyproject(module: str, tests: list[str]) -> str:
    """The work folder's pyproject.toml: the repository's pytest options and this module's
    mutmut configuration (nothing else: mutmut reads only `[tool.mutmut]`)."""

    pytest_opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    mutmut = {
        "source_paths": list(PACKAGES),
        "only_mutate": [module],
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
        "also_copy": ["docs", "README.md"],  # what tests read besides code (the report's)
        "use_git_change_detection": False,  # the work folder is a snapshot, not a checkout
        "timeout_multiplier": 2.5,  # mutmut allows 2x this times the tests' time, in CPU s
    }
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in pytest_opts["ini_options"].items()]
    lines += ["", "[tool.mutmut]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in mutmut.items()]
    return "\n".join(lines) + "\n"


def prepare(module: str, tests: list[str]) -> Path:
    """A fresh work folder for `module`: the packages and tests copied, the configuration."""
    work = WORK / slug(module)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
    for name in COPIED:
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    shutil.copytree(ROOT / "docs", work / "docs")
    shutil.copyfile(ROOT / "README.md", work / "README.md")
    (work / "pyproject.toml").write_text(pyproject(module, tests))
    return work


def mutant_names(work: Path, module: str) -> list[str]:
    """Every mutant mutmut makes of `module`, by name (as `mutmut run` names them)."""
    from mutmut import configuration
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    here = Path.cwd()
    os.chdir(work)
    try:
        configuration.reset_config()
        made = mutate_file_contents(module, Path(module).read_text())
    finally:
        os.chdir(here)
        configuration.reset_config()
    return sorted(get_mutant_name(Path(module), n) for n in made.mutant_names)


_PROGRESS = re.compile(r"(\d+)/(\d+)\s")


def run_mutmut(work: Path, names: list[str], children: int, label: str, expected: int) -> int:
    """`mutmut run` in `work` (only `names` when given), its progress (of the `expected`
    mutants) printed as a line every ~10% or 30 s; its whole output kept in `work/mutmut.log`."""
    cmd = [str(Path(sys.executable).parent / "mutmut"), "run", "--max-children", str(children)]
    env = dict(os.environ, HYPOTHESIS_PROFILE="mutation", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    last, last_t = -1, 0.0
    with open(work / "mutmut.log", "w") as log:
        proc = subprocess.Popen(
            [*cmd, *names],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
        )
        assert proc.stdout is not None
        buf = ""
        while chunk := proc.stdout.read(256):
            log.write(chunk)
            buf += chunk
            *parts, buf = re.split(r"[\r\n]", buf)
            for part in parts:
                m = _PROGRESS.search(part)
                if m is None:
                    if part.strip().startswith(("Running", "Generating", "Failed", "Stopping")):
                        print(f"  [{label}] {part.strip()}", flush=True)
                    continue
                done, total = int(m.group(1)), expected  # mutmut's total counts every mutant
                now = time.monotonic()
                if done == total or done - last >= max(1, total // 10) or now - last_t > 30:
                    print(f"  [{label}] {done}/{total} mutants done", flush=True)
                    last, last_t = done, now
        return proc.wait()


def verdicts(work: Path, module: str) -> dict[str, str]:
    """Each mutant's verdict, from mutmut's record of the module (mutants/<module>.meta)."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads((work / "mutants" / (module + ".meta")).read_text())
    return {k: status_by_exit_code[v] for k, v in meta["exit_code_by_key"].items()}


def write_survivors(work: Path, survivors: list[str]) -> None:
    """Each surviving mutant's diff (`mutmut show`) into work/survivors.txt."""
    mutmut = str(Path(sys.executable).parent / "mutmut")
    with open(work / "survivors.txt", "w") as out:
        for name in survivors:
            shown = subprocess.run(
                [mutmut, "show", name], cwd=work, capture_output=True, text=True, check=False
            )
            out.write(shown.stdout + shown.stderr + "\n")


def run_module(
    module: str, tests: list[str], sample: int, children: int, label: str, only: list[str]
) -> Row:
    started = time.monotonic()
    print(f"[{label}] {module}: preparing .mutation/{slug(module)}/", flush=True)
    work = prepare(module, tests)
    names = mutant_names(work, module)
    chosen = [n for n in names if not only or any(fnmatch.fnmatch(n, p) for p in only)]
    chosen = chosen[::sample] if sample > 1 or only else []
    if only and not chosen:
        raise SystemExit(f"{module}: no mutant matches {only}")
    print(
        f"[{label}] {module}: {len(names)} mutants"
        + (f", running 1 in {sample} by name ({len(chosen)})" if sample > 1 else "")
        + (f", only {' '.join(only)} ({len(chosen)})" if only else "")
        + f", tests: {' '.join(tests)}",
        flush=True,
    )
    rc = run_mutmut(work, chosen, children, label, len(chosen or names))
    seen = verdicts(work, module) if (work / "mutants" / (module + ".meta")).exists() else {}
    if chosen:
        seen = {k: v for k, v in seen.items() if k in set(chosen)}
    counts = Counter(seen.values())
    if rc != 0 or counts["not checked"]:
        print(
            f"[{label}] {module}: mutmut exited {rc}, {counts['not checked']} not checked;"
            f" see .mutation/{slug(module)}/mutmut.log",
            flush=True,
        )
    survivors = sorted(k for k, v in seen.items() if v in ("survived", "no tests", "suspicious"))
    write_survivors(work, survivors)
    command = "python -m evaluation.mutation --module " + module
    if sample > 1:
        command += f" --sample {sample}"
    command += "".join(f" --only '{p}'" for p in only)
    if tests != TESTS.get(module):
        command += "".join(f" --tests {t}" for t in tests)
    row = Row(
        module=module,
        mutants=len(names),
        run=len(seen),
        killed=counts["killed"],
        survived=counts["survived"],
        no_tests=counts["no tests"],
        timeout=counts["timeout"] + counts["segfault"],
        suspicious=counts["suspicious"] + counts["check was interrupted by user"],
        sample=sample,
        seconds=round(time.monotonic() - started, 1),
        command=command,
    )
    print(f"[{label}] {module}: {row.score:.1f}% ({row.killed}/{row.checked} killed)", flush=True)
    return row


def table(rows: list[Row]) -> str:
    head = (
        "| module | mutants | run | killed | survived | no tests | timeout | suspicious | score |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        run = f"{r.run}" + (f" (1 in {r.sample})" if r.sample > 1 else "")
        lines.append(
            f"| {r.module} | {r.mutants} | {run} | {r.killed} | {r.survived} | {r.no_tests}"
            f" | {r.timeout} | {r.suspicious} | {f'{r.score:.1f}%' if r.checked else 'n/a'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluation.mutation", description=__doc__)
    p.add_argument("--module", action="append", help="a module to mutate (repeatable)")
    p.add_argument("--tests", action="append", help="tests to run instead of the module's list")
    p.add_argument("--sample", type=int, default=1, help="run every k-th mutant by name")
    p.add_argument("--only", action="append", default=[], help="mutant names (glob) to run")
    p.add_argument("--children", type=int, default=os.cpu_count() or 2, help="parallel mutants")
    p.add_argument("--list", action="store_true", help="print the modules and their tests")
    args = p.parse_args(argv)
    if args.list:
        for module, tests in TESTS.items():
            print(module + ":\n  " + "\n  ".join(tests))
        return 0
    modules = args.module or list(TESTS)
    unknown = [m for m in modules if not (ROOT / m).is_file()]
    if unknown:
        p.error(f"no such module: {', '.join(unknown)}")
    if args.tests is None and any(m not in TESTS for m in modules):
        p.error("a module without a test list of its own needs --tests")
    WORK.mkdir(exist_ok=True)
    scores = WORK / "scores.json"
    rows = []
    for i, module in enumerate(modules, 1):
        tests = args.tests or TESTS[module]
        label = f"{i}/{len(modules)}"
        row = run_module(module, tests, args.sample, args.children, label, args.only)
        rows.append(row)
        if args.only:  # a check of a few mutants: printed, not a module's score
            continue
        # read again just before writing: another run may have added rows meanwhile
        old = json.loads(scores.read_text()) if scores.exists() else []
        kept = {r["module"]: Row(**r) for r in old}
        kept[module] = row
        scores.write_text(json.dumps([asdict(r) for r in kept.values()], indent=1) + "\n")
        (WORK / "scores.md").write_text(table(list(kept.values())))
    print()
    print(table(rows), end="")
    print(f"\n(all runs so far: {WORK.relative_to(ROOT)}/scores.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
