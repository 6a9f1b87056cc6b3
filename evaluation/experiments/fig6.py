"""Fig. 6: mean ACT per workload, Tangram vs each workload's baseline; the rollout makespan
stands in for the step time (the paper's arrows: 1.4x AI coding, 1.5x DeepSearch)."""

from __future__ import annotations

from typing import Any

from evaluation.experiments.common import Compare, Outcome, Runner, ratio
from evaluation.experiments.suite import run_suite, suite_runs
from evaluation.experiments.sweep import headline

PAPER_STEP = {"coding": 1.4, "deepsearch": 1.5}
PAPER_ACT = {"coding": 4.3}


def plot(rows, fig) -> None:
    """As the paper's Fig. 6: each workload's ACT normalised to its baseline (baseline = 1)."""
    ax = fig.add_subplot(1, 1, 1)
    names = sorted({r["workload"] for r in rows}, key=[r["workload"] for r in rows].index)
    for i, n in enumerate(names):
        ours, base = [r for r in rows if r["workload"] == n]
        for j, key in enumerate(("act_per_trajectory_s", "makespan_s")):
            v = ours[key] / base[key] if base[key] else 0.0
            ax.bar(i + 0.4 * j - 0.2, v, 0.38, color=("tab:blue", "tab:cyan")[j],
                   label=("ACT per trajectory", "rollout makespan")[j] if i == 0 else None)
            ax.text(i + 0.4 * j - 0.2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
            paper = (PAPER_ACT if j == 0 else PAPER_STEP).get(n)
            if paper:
                ax.plot([i + 0.4 * j - 0.2], [1.0 / paper], "x", color="tab:red", ms=9,
                        label="paper" if n == "coding" and j == 0 else None)
    ax.axhline(1.0, color="gray", ls="--", lw=1, label="baseline = 1")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("Tangram / baseline (lower is better)")
    ax.set_ylim(0, 1.25)
    ax.legend(fontsize=7)


def _rows_and_compares(suite) -> tuple[list[dict[str, Any]], list[Compare]]:
    rows: list[dict[str, Any]] = []
    compares: list[Compare] = []
    for name, runs in suite.items():
        for sr in runs:
            r = sr.result
            rows.append({"workload": name, "system": sr.policy.name,
                         "batch": len(sr.workload.trajectories), "actions": len(r.records),
                         "mean_act_s": round(r.mean_act(), 4),
                         "act_per_trajectory_s": round(r.per_trajectory() + r.mean_setup()
                                                       if name == "coding" else
                                                       r.per_trajectory(), 3),
                         "makespan_s": round(r.makespan, 2), "api_429": sr.rejections(),
                         "restores": int(r.counters["restores"])})
        ours, base = rows[-2], rows[-1]
        compares.append(Compare(f"{name}: ACT per trajectory, baseline / Tangram",
                                ratio(base["act_per_trajectory_s"], ours["act_per_trajectory_s"]),
                                PAPER_ACT.get(name), note="paper: lower in every workload"))
        compares.append(Compare(f"{name}: rollout makespan, baseline / Tangram",
                                ratio(base["makespan_s"], ours["makespan_s"]),
                                PAPER_STEP.get(name),
                                note="paper: whole RL step incl. generation and training"))
    return rows, compares


TARGETS = ("coding", "k8s", "search", "api-retry")


def measure(quick: bool) -> dict[str, float | None]:
    """Only the figures with a paper value (AI coding, DeepSearch)."""
    with Runner(4, quiet=True) as runner:
        return headline(_rows_and_compares(run_suite(quick, runner,
                                                     ("coding", "deepsearch")))[1])


def main(quick: bool, quiet: bool) -> Outcome:
    with Runner(suite_runs(), quiet) as runner:
        suite = run_suite(quick, runner)
    rows, compares = _rows_and_compares(suite)
    note = ("ACT per trajectory = summed ACT of its actions (AI coding: plus its environment "
            "setup, i.e. pod pending + start for Kubernetes, container start for Tangram).")
    return Outcome("fig6", rows, compares, plot, notes=[note],
                   title="ACT and rollout time normalised to each workload's baseline")
