"""Fig. 9: the elastic heuristic vs fixed DoP 1, 4 and 16 over the batch size on AI coding
(reward test runs are the elastic actions), with `min` and, on a small instance, the exact
policy."""

from __future__ import annotations

from typing import Any

from evaluation.experiments.common import (
    Compare,
    Outcome,
    Runner,
    act_columns,
    plain,
    tangram,
    workload,
)
from evaluation.experiments.exactpol import SMALL, exact_policy

QUICK: dict[str, Any] = {"batches": (32, 64, 128), "nodes": 1, "cores": 128, "at": 128}
FULL: dict[str, Any] = {
    "batches": (256, 512, 768, 1024, 1280),
    "nodes": 2,
    "cores": 256,
    "at": 1280,
}


def plot(rows, fig) -> None:
    """Left: each fixed DoP's (and min's) mean ACT over the elastic heuristic's, linear, the
    paper's 3.0x for DoP 16 at the largest batch marked. Right: the small instance's mean ACT
    per policy, the exact policy's where CP-SAT is available."""
    ax = fig.add_subplot(1, 2, 1)
    batch = [r for r in rows if r["sweep"] == "batch"]
    xs = sorted({r["batch"] for r in batch})
    at = lambda x, s: next(r["mean_act_s"] for r in batch if r["batch"] == x and r["system"] == s)
    for system in ("fixed-dop-1", "fixed-dop-4", "fixed-dop-16", "min"):
        ax.plot(
            xs,
            [at(x, system) / at(x, "tangram") for x in xs],
            marker="o",
            label=f"{system} / elastic",
        )
    ax.plot([xs[-1]], [3.0], "x", color="tab:red", ms=9, label="paper: DoP 16, largest batch")
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    ax.set_xlabel("RL batch size (trajectories)")
    ax.set_ylabel("mean ACT, ratio to the elastic heuristic (x)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax2 = fig.add_subplot(1, 2, 2)
    small = [r for r in rows if r["sweep"] == "small"]
    ax2.bar(range(len(small)), [r["mean_act_s"] for r in small])
    ax2.set_xticks(
        range(len(small)),
        [r["system"].replace("fixed-dop-", "DoP ") for r in small],
        fontsize=7,
        rotation=30,
    )
    ax2.set_ylabel("mean ACT (s)")
    ax2.set_title("small instance (exact where available)", fontsize=8)


def _policies():
    return [
        tangram(),
        plain("fixed-dop", dop=1),
        plain("fixed-dop", dop=4),
        plain("fixed-dop", dop=16),
        plain("min"),
    ]


TARGETS = ("coding",)
DOP16 = "fixed DoP=16 / elastic, batch {}"


def measure(quick: bool) -> dict[str, float | None]:
    cfg = QUICK if quick else FULL
    w = workload("coding", batch=cfg["at"], nodes=cfg["nodes"], cores_per_node=cfg["cores"])
    with Runner(2, quiet=True) as runner:
        ours, dop16 = (
            runner.run("at", w, p).mean_act() for p in (tangram(), plain("fixed-dop", dop=16))
        )
    return {DOP16.format(cfg["at"]): dop16 / ours}


def _compares(cfg: dict[str, Any], rows: list[dict[str, Any]], quick: bool) -> list[Compare]:
    """The figure's comparisons, from its rows (and `measure` for the gated one)."""
    at = {
        r["system"]: r["mean_act_s"]
        for r in rows
        if r["sweep"] == "batch" and r["batch"] == cfg["at"]
    }
    compares = [
        Compare(
            f"fixed DoP={d} / elastic, batch {cfg['at']}",
            at[f"fixed-dop-{d}"] / at["tangram"],
            None,
        )
        for d in (1, 4)
    ]
    compares.append(Compare(DOP16.format(cfg["at"]), measure(quick)[DOP16.format(cfg["at"])], 3.0))
    compares.append(Compare(f"min / elastic, batch {cfg['at']}", at["min"] / at["tangram"], None))
    small = {r["system"]: r["mean_act_s"] for r in rows if r["sweep"] == "small"}
    if "exact" in small:
        compares.append(
            Compare(
                "small: heuristic / exact",
                small["tangram"] / small["exact"],
                None,
                note="receding-horizon CP-SAT, 0.5 s per decision",
            )
        )
    return compares


def main(quick: bool, quiet: bool) -> Outcome:
    cfg = QUICK if quick else FULL
    exact, why = exact_policy()
    rows: list[dict[str, Any]] = []
    n = len(cfg["batches"]) * len(_policies()) + len(_policies()) + (exact is not None)
    with Runner(n, quiet) as runner:
        for b in cfg["batches"]:
            w = workload("coding", batch=b, nodes=cfg["nodes"], cores_per_node=cfg["cores"])
            for p in _policies():
                r = runner.run(f"batch={b}", w, p)
                rows.append(
                    {
                        "sweep": "batch",
                        "batch": b,
                        "system": p.name,
                        "mean_act_s": round(r.mean_act(), 4),
                        "reward_act_s": round(r.mean_act("reward"), 3),
                        **act_columns(r),
                    }
                )
        w = workload("coding", **SMALL)
        for p in _policies() + ([exact] if exact is not None else []):
            r = runner.run("small", w, p)
            rows.append(
                {
                    "sweep": "small",
                    "batch": SMALL["batch"],
                    "system": p.name,
                    "mean_act_s": round(r.mean_act(), 4),
                    "reward_act_s": round(r.mean_act("reward"), 3),
                    **act_columns(r),
                }
            )
    compares = _compares(cfg, rows, quick)
    notes = [why] if why else []
    if quick:
        notes.append(
            "quick mode compares at batch 128 on 128 cores; the paper's point is "
            "batch 1280 (full mode)"
        )
    return Outcome(
        "fig9",
        rows,
        compares,
        plot,
        notes,
        title="elastic scheduling vs fixed degrees of parallelism (AI coding)",
    )
