"""Fig. 8 (CPU): AI coding's mean ACT as the batch grows (fixed capacity) and as the capacity
shrinks (fixed batch), Tangram vs Kubernetes; `min` (no elasticity) shows what the elastic
heuristic adds and, on a small instance, the exact policy how far it is from optimal."""

from __future__ import annotations

from typing import Any

from evaluation.experiments.common import (
    ACT_DEFINITION,
    Compare,
    Outcome,
    Runner,
    act_columns,
    kubernetes,
    plain,
    tangram,
    workload,
)
from evaluation.experiments.exactpol import SMALL, exact_policy

QUICK: dict[str, Any] = {
    "batches": (32, 64, 128),
    "cores": 128,
    "capacities": (64, 128, 256),
    "batch": 64,
}
FULL: dict[str, Any] = {
    "batches": (256, 512, 1024, 2048),
    "cores": 1024,
    "capacities": (512, 1024, 2048),
    "batch": 1024,
}


def _workload(batch: int, cores: int):
    nodes = max(1, cores // 256)
    return workload("coding", batch=batch, nodes=nodes, cores_per_node=cores // nodes)


def _ratio(runner: Runner, batch: int, cores: int, admission: bool = False) -> float:
    """Kubernetes' mean ACT over Tangram's (the paper's ACT: queue + run per action), or with
    `admission` their ACT plus admission wait per trajectory."""
    w = _workload(batch, cores)
    ours, k8s = (runner.run(f"batch={batch}", w, p) for p in (tangram(), kubernetes()))
    if admission:
        return (k8s.per_trajectory() + k8s.mean_setup()) / (
            ours.per_trajectory() + ours.mean_setup()
        )
    return k8s.mean_act() / ours.mean_act()


TARGETS = ("coding", "k8s")


def measure(quick: bool) -> dict[str, float | None]:
    cfg = QUICK if quick else FULL
    with Runner(4, quiet=True) as runner:
        return {
            SMALLEST: _ratio(runner, cfg["batches"][0], cfg["cores"]),
            LARGEST: _ratio(runner, cfg["batches"][-1], cfg["cores"]),
        }


SMALLEST, LARGEST = "ACT vs Kubernetes, smallest batch", "ACT vs Kubernetes, largest batch"
WITH_ADMISSION = "ACT + admission vs Kubernetes, largest batch"


def plot(rows, fig) -> None:
    """Kubernetes' ACT per trajectory over Tangram's (and min's over Tangram's), linear axis,
    as the batch grows and as the capacity shrinks; the paper's two points marked."""
    for i, sweep in enumerate(("batch", "capacity")):
        ax = fig.add_subplot(1, 2, i + 1)
        xs = sorted({r["x"] for r in rows if r["sweep"] == sweep})
        get = lambda x, s, sw=sweep: next(
            (r["action_s"] for r in rows if r["sweep"] == sw and r["x"] == x and r["system"] == s),
            None,
        )
        for system in ("k8s", "min"):
            pts = [
                (x, get(x, system) / get(x, "tangram"))
                for x in xs
                if get(x, system) is not None and get(x, "tangram")
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{system} / Tangram")
        if sweep == "batch":
            ax.plot(
                [xs[0], xs[-1]],
                [3.1, 27.7],
                "x",
                color="tab:red",
                ms=9,
                label="paper (smallest, largest batch)",
            )
        ax.axhline(1.0, color="gray", ls="--", lw=1)
        ax.set_xlabel("RL batch size (trajectories)" if sweep == "batch" else "CPU cores")
        ax.set_ylabel("mean ACT (queue + run), ratio to Tangram (x)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)


def _compares(
    head: dict[str, float | None], with_admission: float, rows: list[dict[str, Any]]
) -> list[Compare]:
    """The figure's comparisons: the gated ratios (`measure`), the one with admission, and the
    small instance's."""
    compares = [
        Compare(SMALLEST, head[SMALLEST], 3.1),
        Compare(LARGEST, head[LARGEST], 27.7),
        Compare(
            WITH_ADMISSION,
            with_admission,
            None,
            note="pods pending for cores counted: not the paper's ACT",
        ),
    ]
    small = {r["system"]: r["mean_act_s"] for r in rows if r["sweep"] == "small"}
    if "exact" in small:
        compares.append(
            Compare(
                "small instance: heuristic / exact mean ACT",
                small["tangram"] / small["exact"],
                None,
                note="receding-horizon CP-SAT, 0.5 s per decision",
            )
        )
    compares.append(
        Compare("small instance: min / heuristic mean ACT", small["min"] / small["tangram"], None)
    )
    return compares


def main(quick: bool, quiet: bool) -> Outcome:
    cfg = QUICK if quick else FULL
    exact, why = exact_policy()
    n = 3 * len(cfg["batches"]) + 2 * len(cfg["capacities"]) + 2 + (exact is not None)
    rows: list[dict[str, Any]] = []
    with Runner(n, quiet) as runner:
        for sweep, xs in (("batch", cfg["batches"]), ("capacity", cfg["capacities"])):
            for x in xs:
                w = _workload(x, cfg["cores"]) if sweep == "batch" else _workload(cfg["batch"], x)
                pols = [tangram(), kubernetes()] + ([plain("min")] if sweep == "batch" else [])
                for p in pols:
                    res = runner.run(f"{sweep}={x}", w, p)
                    rows.append(
                        {
                            "sweep": sweep,
                            "x": x,
                            "system": p.name,
                            "mean_act_s": round(res.mean_act(), 4),
                            **act_columns(res),
                        }
                    )
        w = workload("coding", **SMALL)
        for p in [tangram(), plain("min")] + ([exact] if exact is not None else []):
            res = runner.run("small", w, p)
            rows.append(
                {
                    "sweep": "small",
                    "x": SMALL["batch"],
                    "system": p.name,
                    "mean_act_s": round(res.mean_act(), 4),
                    **act_columns(res),
                }
            )
        head = measure(quick)
        with_admission = _ratio(runner, cfg["batches"][-1], cfg["cores"], admission=True)
    compares = _compares(head, with_admission, rows)
    notes = [ACT_DEFINITION + "."]
    if why:
        notes.append(why)
    return Outcome(
        "fig8-cpu",
        rows,
        compares,
        plot,
        notes,
        title="CPU scalability: Kubernetes' ACT over Tangram's",
    )
