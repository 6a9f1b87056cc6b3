"""What every experiment shares: its result type, the systems under test, running one
simulation with a progress bar, and writing CSV + JSON + PNG with a table beside the paper's.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from evaluation.baselines import ByResource, Kubernetes, Lifecycles, StaticServices, pin_services
from evaluation.baselines.api import ApiRetry
from evaluation.baselines.batching import batched_static
from evaluation.closedloop import EnvironmentStart, LoopResult, Policy, run
from evaluation.output import Steps, show_table
from evaluation.runtime_sim import run_on_runtime, runs_on_runtime
from evaluation.workloads import Workload, get_workload
from solvers import get_allocator


@dataclass(frozen=True)
class Compare:
    """One headline figure: ours beside the paper's (None where the paper gives none)."""

    metric: str
    ours: float | None
    paper: float | None
    unit: str = "x"
    note: str = ""
    range: tuple[float, float] | None = None  # ours over the sensitivity sweep (lo <= ours <= hi)


@dataclass
class Outcome:
    name: str
    rows: list[dict[str, Any]]
    compares: list[Compare]
    plot: Callable[[list[dict[str, Any]], Any], None]
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""


# -- systems ---------------------------------------------------------------------------------


def tangram() -> Policy:
    """Tangram's policy in the experiments: the paper's heuristic with depth 2, or the policy
    named by `tangram experiment --policy` (`backfill`, `backfill-srpt`, ...)."""
    name = TANGRAM_POLICY.get()
    return Policy("tangram", get_allocator(name, **tangram_options(name)))


def tangram_options(name: str) -> dict[str, Any]:
    return {"depth": 2} if name.startswith(("heuristic", "backfill")) else {}


def kubernetes(seed: int = 0) -> Policy:
    k = Kubernetes(**{"seed": seed, **overrides("k8s")})
    return Policy("k8s", k, k)


def plain(name: str, **options) -> Policy:
    label = name if not options else name + "".join(f"-{v}" for v in options.values())
    return Policy(label, get_allocator(name, **options))


def static_gpu(
    services: Sequence[str], workload: Workload, gpus_each: int, replicas: int = 1
) -> StaticServices:
    spec = workload.gpu
    assert spec is not None
    total = spec.nodes * spec.gpus_per_node
    while gpus_each > 1 and len(services) * replicas * gpus_each > total:
        gpus_each //= 2  # fewer GPUs than the deployment asks: each service gets fewer
    return StaticServices(
        pins=pin_services(services, spec.node_names(), spec.gpus_per_node, gpus_each, replicas)
    )


def static_policy(name: str, static: StaticServices) -> Policy:
    """Static services are deployed before the run: the allocator is its own lifecycle."""
    return Policy(name, static, static)


def batching_static(
    name: str, services: Sequence[str], w: Workload, gpus_each: int, replicas: int = 1
) -> tuple[Workload, Policy]:
    """Static services whose replicas batch concurrent calls (SGLang's continuous batching,
    `evaluation.baselines.batching`): the lane workload they run on and their policy."""
    spec = w.gpu
    assert spec is not None
    total = spec.nodes * spec.gpus_per_node
    while gpus_each > 1 and len(services) * replicas * gpus_each > total:
        gpus_each //= 2
    wide, static, executors = batched_static(
        w, services, gpus_each, replicas, **overrides("batching")
    )
    return wide, Policy(name, static, static, executors=executors)


def search_baseline(
    workload: Workload, judge: StaticServices, executors: Callable | None = None
) -> Policy:
    """DeepSearch's baseline: per-trajectory API calls with retries, static judge replicas
    (`executors`: the batching replicas' model, `batching_static`)."""
    api = ApiRetry(**overrides("api-retry"))
    return Policy(
        "api-retry+static",
        ByResource((("api:", api), ("gpu", judge))),
        Lifecycles((api, judge)),
        executors=executors,
    )


# -- running ---------------------------------------------------------------------------------


class Runner:
    """Runs simulations under one progress display (`evaluation.output.Steps`) or silently."""

    def __init__(self, total_runs: int, quiet: bool = False) -> None:
        self.quiet = quiet
        self.total = total_runs
        self._steps = Steps(total_runs, RUNNING.get(), quiet=quiet)

    def __enter__(self) -> Runner:
        self._steps.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._steps.__exit__(*exc)

    def run(self, label: str, workload: Workload, policy: Policy) -> LoopResult:
        what = f"{label}: {policy.name}"
        self._steps.describe(what)
        res = cached_run(workload, policy)
        self._steps.advance(what)
        return res


RUNNING: ContextVar[str] = ContextVar("running", default="runs")  # the experiment's name

_CACHE: dict[tuple, LoopResult] = {}


def cached_run(workload: Workload, policy: Policy) -> LoopResult:
    """Simulations are deterministic: one run per (workload, policy, overrides, oracle) in a
    process, so the sweep's default point and an experiment's own runs are the same runs."""
    key = (
        workload.name,
        repr(workload.params),
        len(workload.trajectories),
        policy.name,
        workload.gpu.nodes if workload.gpu else 0,
        repr(overrides("k8s")),
        repr(overrides("api-retry")),
        repr(overrides("batching")),
        ORACLE.get(),
        TANGRAM_POLICY.get(),
        ENGINE.get(),
    )
    if key not in _CACHE:
        if len(_CACHE) > 256:
            _CACHE.clear()
        res = _run(workload, policy)
        res.counters["client_429"] = float(client_rejections(policy))  # kept with the result
        _CACHE[key] = res
    return _CACHE[key]


def _run(workload: Workload, policy: Policy) -> LoopResult:
    """The closed-loop engine, or under `--engine runtime` the runtime itself on virtual time
    (`evaluation.runtime_sim`: the `Tangram` facade, the CPU, GPU and API managers on sim
    backends) for Tangram's runs. A baseline stays on the engine: its lifecycle (a
    Kubernetes pod reserving cores per trajectory, static GPU replicas, retrying API clients)
    is not one the runtime has; so does `--oracle` (the runtime never sees an action's true
    duration)."""
    if (
        ENGINE.get() == "runtime"
        and policy.name == "tangram"
        and not ORACLE.get()
        and policy.executors is None
        and isinstance(policy.lifecycle, EnvironmentStart)
        and runs_on_runtime(workload)
    ):
        name = TANGRAM_POLICY.get()
        return run_on_runtime(workload, name, policy.lifecycle.start_s, tangram_options(name))
    return run(workload, policy, oracle=ORACLE.get())


# The paper's ACT (DIGEST, section 4.1): "the sum of action completion times, ACTs = sum_i
# (Tq_i + T_i) ... (queueing time plus execution time)" of actions. An action's time is from its
# submission (its trajectory already has a place: a pod, a container) to its end, restores
# included; the wait for that place (a pod pending and starting, a container starting) is the
# trajectory's *admission*, reported beside it and never folded into the headline.
ACT_DEFINITION = (
    "ACT as the paper defines it: per action, queueing plus execution "
    "(Tq + T); admission (a pod pending and starting, a container starting) "
    "is reported beside it"
)


def act_columns(r: LoopResult) -> dict[str, float]:
    """Every row's split of ACT: `action_s` (mean per action), `action_per_trajectory_s`
    (summed per trajectory), `admission_s` (mean wait per trajectory for its environment),
    `total_per_trajectory_s` (the two together), `server_429` (answers of 429 counted at the
    simulated API server, every system) and `client_429` (the 429s the baseline's retrying
    clients saw)."""
    action, admission = r.per_trajectory(), r.mean_setup()
    return {
        "action_s": round(r.mean_act(), 4),
        "action_per_trajectory_s": round(action, 3),
        "admission_s": round(admission, 3),
        "total_per_trajectory_s": round(action + admission, 3),
        "server_429": int(r.counters.get("api_429", 0)),
        "client_429": int(r.counters.get("client_429", 0)),
    }


def client_rejections(policy: Policy) -> int:
    """429 answers the baseline's retrying clients got (their API calls found the limit)."""
    routes = policy.allocator.routes if isinstance(policy.allocator, ByResource) else ()
    return sum(a.rejections for _, a in routes if isinstance(a, ApiRetry))


# -- parameter overrides (the sensitivity sweep) ---------------------------------------------

# target -> {field: value}: workload params ("coding", "search", "mopd"), baselines ("k8s",
# "api-retry") and sizes ("size": {"batch": f, "capacity": f, "gpu_capacity": f})
_NONE: Mapping[str, Mapping[str, Any]] = MappingProxyType({})
_OVERRIDES: ContextVar[Mapping[str, Mapping[str, Any]]] = ContextVar("overrides", default=_NONE)
ORACLE: ContextVar[bool] = ContextVar("oracle", default=False)
TANGRAM_POLICY: ContextVar[str] = ContextVar("tangram_policy", default="heuristic")
ENGINE: ContextVar[str] = ContextVar("engine", default="engine")  # or "runtime" (`_run`)
PARAMS_TARGET = {"coding": "coding", "deepsearch": "search", "mopd": "mopd"}


def overrides(target: str) -> dict[str, Any]:
    return dict(_OVERRIDES.get().get(target, {}))


@contextmanager
def overriding(ov: Mapping[str, Mapping[str, Any]]) -> Iterator[None]:
    """Set parameters for the runs inside; nested overrides merge (size factors multiply)."""
    merged = {t: dict(v) for t, v in _OVERRIDES.get().items()}
    for t, v in ov.items():
        for k, x in v.items():
            cur = merged.setdefault(t, {})
            cur[k] = cur[k] * x if t == "size" and k in cur else x
    token = _OVERRIDES.set(merged)
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


@contextmanager
def _set(var: ContextVar[Any], value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def tangram_policy(name: str):
    """Tangram's policy for the runs inside (`tangram experiment --policy`)."""
    return _set(TANGRAM_POLICY, name)


def engine(name: str):
    """Which engine Tangram's CPU runs use inside: "engine" or "runtime" (`_run`)."""
    return _set(ENGINE, name)


def oracle_estimates(on: bool):
    """Hand the scheduler each action's sampled duration inside (`--oracle`)."""
    return _set(ORACLE, on)


def workload(name: str, **sizes: Any) -> Workload:
    """`get_workload` with the current overrides: the workload's own parameters, then the size
    factors (batch; capacity as CPU nodes from 4 up, else cores per node; GPU nodes)."""
    kw = {**sizes, **overrides(PARAMS_TARGET.get(name, name))}
    scale = overrides("size")
    if "batch" in scale:
        kw["batch"] = max(1, round(kw.get("batch", 1) * scale["batch"]))
    f = scale.get("capacity")
    if f is not None and name == "coding":
        if kw.get("nodes", 1) >= 4:
            kw["nodes"] = max(1, round(kw["nodes"] * f))
        else:
            kw["cores_per_node"] = max(8, round(kw.get("cores_per_node", 256) * f))
    g = scale.get("gpu_capacity")
    if g is not None and name in ("mopd", "mopd+search"):
        kw["gpu_nodes"] = max(1, round(kw.get("gpu_nodes", 5) * g))
    return get_workload(name, **kw)


def ratio(baseline: float, ours: float) -> float | None:
    return baseline / ours if ours > 0 else None


# -- output ----------------------------------------------------------------------------------


def write(outcome: Outcome, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    base = out / outcome.name
    paths = [base.with_suffix(".csv"), base.with_suffix(".json"), base.with_suffix(".png")]
    keys: list[str] = []
    for r in outcome.rows:
        keys.extend(k for k in r if k not in keys)
    with paths[0].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(outcome.rows)
    paths[1].write_text(json.dumps(to_json(outcome), indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 4.6), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[2.1, 1])
    outcome.plot(outcome.rows, left)
    plot_vs_paper(outcome.compares, right)
    fig.suptitle(f"{outcome.name}: {outcome.title}" if outcome.title else outcome.name)
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths


def plot_vs_paper(compares: Sequence[Compare], fig: Any) -> None:
    """Each figure with a paper value as ours / paper (1 = the paper's value, linear axis),
    with its range over the sensitivity sweep as a whisker."""
    ax = fig.add_subplot(1, 1, 1)
    rows = [c for c in compares if c.paper and c.ours is not None]
    if not rows:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no figure with a paper value", ha="center", transform=ax.transAxes)
        return
    for i, c in enumerate(rows):
        v = c.ours / c.paper
        ax.plot([v], [i], "o", color="tab:blue", label="ours" if i == 0 else None)
        if c.range is not None:
            lo, hi = c.range[0] / c.paper, c.range[1] / c.paper
            ax.plot(
                [lo, hi],
                [i, i],
                "-",
                color="tab:blue",
                alpha=0.5,
                lw=3,
                label="range over the sweep" if i == 0 else None,
            )
        ax.annotate(
            f"{c.ours:.2f}{c.unit} vs {c.paper:g}{c.unit}",
            (v, i),
            textcoords="offset points",
            xytext=(4, 6),
            ha="left",
            fontsize=7,
        )
    ax.axvline(1.0, color="tab:red", ls="--", label="paper")
    ax.set_yticks(range(len(rows)), [_wrap(c.metric) for c in rows], fontsize=7)
    ax.set_xlabel("ours / paper (1 = the paper's value)")
    top = max(
        [c.ours / c.paper for c in rows]
        + [c.range[1] / c.paper for c in rows if c.range is not None]
        + [1.0]
    )
    ax.set_xlim(0, top * 1.7)  # room for the labels right of the points
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.legend(fontsize=7, loc="lower right")


def _wrap(text: str, width: int = 28) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + len(w) + 1 > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    return "\n".join(lines + [cur])


def to_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "experiment": outcome.name,
        "wall_s": round(outcome.wall_s, 2),
        "rows": outcome.rows,
        "compare": [asdict(c) for c in outcome.compares],
        "notes": outcome.notes,
        "sensitivity": outcome.sensitivity,
    }


def print_table(outcome: Outcome) -> None:
    fmt = lambda v, u: "-" if v is None else f"{v:.2f}{u}"
    rows = []
    for c in outcome.compares:
        rng = "-" if c.range is None else f"{c.range[0]:.2f}-{c.range[1]:.2f}{c.unit}"
        rows.append((c.metric, fmt(c.ours, c.unit), rng, fmt(c.paper, c.unit), c.note))
    show_table(
        f"{outcome.name}: ours vs the paper ({outcome.wall_s:.1f} s)",
        ("figure", "ours", "range (sweep)", "paper", "note"),
        rows,
    )
    for n in outcome.notes:
        print(f"- {n}")


def timed(fn: Callable[[], Outcome]) -> Outcome:
    t0 = time.perf_counter()
    o = fn()
    o.wall_s = time.perf_counter() - t0
    return o
