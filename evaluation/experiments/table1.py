"""Table 1: ACT split into queueing, system overhead and execution, per workload and
concurrency.

AI coding's overhead = the scheduler's decision time, measured (wall clock of every decision
of the run, per action) + the enforcement of each grant: `docker update` of the container's
cpuset and quota, 8.9 ms from dockerd receiving the request to the cgroup write (a sourced
figure, docs/calibration.md §2; `tangram bench exec` measures +1.1-1.7 ms for a direct cgroup
write here).
The `docker exec` round trip of each command (about 70 ms, docs/calibration.md §2) is counted as
execution, as the paper's split counts the command's run in the sandbox; a second row counts it
as overhead. MOPD's overhead is the service restores."""

from __future__ import annotations

from typing import Any

from evaluation.experiments.common import Compare, Outcome, Runner, tangram, workload

DOCKER_UPDATE_S = 0.0089  # docs/calibration.md §2: dockerd request to cgroup write
QUICK: dict[str, Any] = {"coding": (32, 128), "mopd": (128, 512)}
FULL: dict[str, Any] = {"coding": (256, 1024, 2048), "mopd": (512, 1024, 2048)}


def plot(rows, fig) -> None:
    """Each row's mean ACT per action split into queueing, overhead and execution, as shares
    (the paper's Table 1 gives them as a table); the overhead's share printed on its bar."""
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"{r['workload']}\nbatch {r['batch']}" for r in rows]
    totals = [r["queue_s"] + r["overhead_s"] + r["execution_s"] for r in rows]
    bottom = [0.0] * len(rows)
    for part, c in (
        ("queue_s", "tab:gray"),
        ("overhead_s", "tab:red"),
        ("execution_s", "tab:blue"),
    ):
        vals = [100 * r[part] / t if t else 0.0 for r, t in zip(rows, totals)]
        ax.bar(range(len(rows)), vals, bottom=bottom, color=c, label=part[:-2])
        if part == "overhead_s":
            for i, (v, b0) in enumerate(zip(vals, bottom)):
                ax.text(
                    i,
                    b0 + v + 1,
                    f"overhead {v:.1f}%",
                    ha="center",
                    fontsize=7,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("share of the mean ACT per action (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="lower right")


def _rows(cfg, runner: Runner) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for b in cfg["coding"]:
        w = workload("coding", batch=b, nodes=max(1, b // 256), cores_per_node=min(256, b))
        r = runner.run(f"coding {b}", w, tangram())
        n = len(r.records)
        execution = sum(x.end - x.start for x in r.records.values()) / n
        decide = r.counters["decide_wall_s"] / n
        overhead = decide + DOCKER_UPDATE_S
        exec_s = w.params.exec_overhead_s
        queue = sum(x.start - x.arrival for x in r.records.values()) / n
        rows.append(
            {
                "workload": "coding",
                "batch": b,
                "queue_s": round(queue, 4),
                "overhead_s": round(overhead, 4),
                "decision_s": round(decide, 5),
                "enforce_s": DOCKER_UPDATE_S,
                "execution_s": round(execution, 4),
                "overhead_pct": round(100 * overhead / execution, 2),
                "overhead_with_exec_pct": round(
                    100 * (overhead + exec_s) / (execution - exec_s), 2
                ),
            }
        )
    for b in cfg["mopd"]:
        w = workload("mopd", batch=b)
        r = runner.run(f"mopd {b}", w, tangram())
        n = len(r.records)
        overhead = r.counters["overhead_s"] / n
        execution = sum(x.end - x.start for x in r.records.values()) / n - overhead
        queue = sum(x.start - x.arrival for x in r.records.values()) / n
        rows.append(
            {
                "workload": "mopd",
                "batch": b,
                "queue_s": round(queue, 4),
                "overhead_s": round(overhead, 4),
                "execution_s": round(execution, 4),
                "overhead_pct": round(100 * overhead / execution, 2),
            }
        )
    return rows


CODING, MOPD = (
    "AI coding: overhead, % of execution (max over batches)",
    "MOPD: restore overhead, % of execution (max)",
)
TARGETS = ("coding", "mopd")


def _worst(rows, wl: str, key: str = "overhead_pct") -> float:
    return max(r[key] for r in rows if r["workload"] == wl)


def measure(quick: bool) -> dict[str, float | None]:
    cfg = QUICK if quick else FULL
    with Runner(5, quiet=True) as runner:
        rows = _rows(cfg, runner)
    return {CODING: _worst(rows, "coding"), MOPD: _worst(rows, "mopd")}


def main(quick: bool, quiet: bool) -> Outcome:
    cfg = QUICK if quick else FULL
    with Runner(sum(len(v) for v in cfg.values()), quiet) as runner:
        rows = _rows(cfg, runner)
    worst = lambda wl: _worst(rows, wl)
    growth = [r["overhead_pct"] for r in rows if r["workload"] == "mopd"]
    return Outcome(
        "table1",
        rows,
        [
            Compare(
                CODING,
                worst("coding"),
                3.0,
                unit="%",
                note="decision time measured + docker update 8.9 ms (sourced); exec counted "
                "as execution",
            ),
            Compare(
                "AI coding: overhead with the 70 ms docker exec counted as overhead (max)",
                _worst(rows, "coding", "overhead_with_exec_pct"),
                None,
                unit="%",
            ),
            Compare(MOPD, worst("mopd"), 25.0, unit="%", note="paper: about 25%"),
            Compare(
                "MOPD: overhead at the largest / smallest batch",
                growth[-1] / growth[0] if growth[0] else None,
                None,
                note="paper: does not grow with concurrency",
            ),
        ],
        plot,
        title="mean ACT per action: queueing, system overhead, execution",
    )
