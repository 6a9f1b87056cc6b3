"""Fig. 6: mean ACT per workload, Tangram vs each workload's baseline; the rollout makespan
stands in for the step time (the paper's arrows: 1.4x AI coding, 1.5x DeepSearch)."""

from __future__ import annotations

from typing import Any

from evaluation.closedloop import Policy
from evaluation.experiments.common import (
    ACT_DEFINITION,
    Compare,
    Outcome,
    Runner,
    act_columns,
    ratio,
    tangram,
)
from evaluation.experiments.suite import run_suite, suite_runs
from evaluation.experiments.sweep import headline
from evaluation.flowcontrol import LearnedLimits, misconfigured

PAPER_STEP = {"coding": 1.4, "deepsearch": 1.5}
PAPER_ACT = {"coding": 4.3}


def plot(rows, fig) -> None:
    """As the paper's Fig. 6, read the way the table reads: each workload's speed-up over its
    baseline (baseline / Tangram; 1 = the baseline, higher is better), log scale so that 0.8x
    and 11x both show; the paper's arrows as red ticks beside their bars."""
    ax = fig.add_subplot(1, 1, 1)
    names = sorted({r["workload"] for r in rows}, key=[r["workload"] for r in rows].index)
    values = []
    for i, n in enumerate(names):
        ours, base = [r for r in rows if r["workload"] == n][:2]  # Tangram, its baseline
        for j, key in enumerate(("action_s", "makespan_s")):
            v = base[key] / ours[key] if ours[key] and base[key] else 1.0
            values.append(v)
            x = i + 0.4 * j - 0.2
            ax.bar(
                x, v, 0.38, color=("tab:blue", "tab:cyan")[j], label=_BARS[j] if i == 0 else None
            )
            ax.annotate(
                f"{v:.2f}x",
                (x, v),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
            paper = (PAPER_ACT if j == 0 else PAPER_STEP).get(n)
            if paper:
                values.append(paper)
                ax.plot(
                    [x + 0.24],
                    [paper],
                    "<",
                    color="tab:red",
                    ms=7,
                    label="paper" if not any(h.get_label() == "paper" for h in ax.lines) else None,
                )
    ax.axhline(1.0, color="gray", ls="--", lw=1, label="baseline = 1")
    ax.set_yscale("log")
    ax.set_ylim(min(values + [1.0]) / 1.6, max(values + [1.0]) * 1.8)  # room for every label
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("baseline / Tangram (higher is better)")
    ax.legend(fontsize=7, loc="upper left")


_BARS = ("ACT (queue + run per action)", "rollout makespan")


def _rows_and_compares(suite) -> tuple[list[dict[str, Any]], list[Compare]]:
    rows: list[dict[str, Any]] = []
    compares: list[Compare] = []
    for name, runs in suite.items():
        for sr in runs:
            r = sr.result
            rows.append(
                {
                    "workload": name,
                    "system": sr.policy.name,
                    "batch": len(sr.workload.trajectories),
                    "actions": len(r.records),
                    **act_columns(r),
                    "makespan_s": round(r.makespan, 2),
                    "restores": int(r.counters["restores"]),
                }
            )
        ours, base = rows[-2], rows[-1]
        compares.append(
            Compare(
                f"{name}: ACT (queue + run per action), baseline / Tangram",
                ratio(base["action_s"], ours["action_s"]),
                PAPER_ACT.get(name),
                note="paper: lower in every workload",
            )
        )
        compares.append(
            Compare(
                f"{name}: ACT + admission per trajectory, baseline / Tangram",
                ratio(base["total_per_trajectory_s"], ours["total_per_trajectory_s"]),
                None,
                note="admission: pod pending + start (k8s), container start",
            )
        )
        compares.append(
            Compare(
                f"{name}: rollout makespan, baseline / Tangram",
                ratio(base["makespan_s"], ours["makespan_s"]),
                PAPER_STEP.get(name),
                note="paper: whole RL step incl. generation and training",
            )
        )
    return rows, compares


TARGETS = ("coding", "k8s", "search", "api-retry")


def measure(quick: bool) -> dict[str, float | None]:
    """Only the figures with a paper value (AI coding, DeepSearch)."""
    with Runner(4, quiet=True) as runner:
        return headline(_rows_and_compares(run_suite(quick, runner, ("coding", "deepsearch")))[1])


WRONG = 4  # Tangram told this many times the API server's limit


def _wrong_limit(suite, runner: Runner) -> tuple[list[dict[str, Any]], list[Compare]]:
    """DeepSearch with Tangram's API pools at `WRONG` times the server's limit, with and
    without flow control that learns the limit from the server's 429s."""
    w = suite["deepsearch"][0].workload
    over = misconfigured(w, WRONG)
    start = {r: WRONG * k for r, k in w.api_limits.items()}
    learner = LearnedLimits(tangram().allocator, start)
    rows, compares = [], []
    for p in (
        Policy(f"tangram-{WRONG}x-limit", tangram().allocator),
        Policy(f"tangram-{WRONG}x-limit-learning", learner, learner),
    ):
        r = runner.run("deepsearch", over, p)
        rows.append(
            {
                "workload": "deepsearch",
                "system": p.name,
                "batch": len(w.trajectories),
                "actions": len(r.records),
                **act_columns(r),
                "server_429_late": int(r.counters["api_429_late"]),
                "makespan_s": round(r.makespan, 2),
                "restores": int(r.counters["restores"]),
            }
        )
        compares.append(
            Compare(
                f"deepsearch: API 429 at the server, {p.name}",
                float(rows[-1]["server_429"]),
                None,
                unit="",
                note=f"{rows[-1]['server_429_late']} in the rollout's second half",
            )
        )
    return rows, compares


def main(quick: bool, quiet: bool) -> Outcome:
    with Runner(suite_runs() + 2, quiet) as runner:
        suite = run_suite(quick, runner)
        more_rows, more = _wrong_limit(suite, runner)
    rows, compares = _rows_and_compares(suite)
    rows += more_rows
    compares += more
    note = (
        ACT_DEFINITION + ". Rows: action_s (mean per action), action_per_trajectory_s, "
        "admission_s (per trajectory), total_per_trajectory_s, server_429 (at the simulated "
        "API server)."
    )
    return Outcome(
        "fig6",
        rows,
        compares,
        plot,
        notes=[note],
        title="speed-up over each workload's baseline (baseline / Tangram)",
    )
