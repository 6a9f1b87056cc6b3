"""What `tangram bench scale` prints and writes: a run's one line, the table, the JSON document
and the plot (the bench itself: `evaluation.benches.scale`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from evaluation.benches.scale_run import GOAL_SHARE, GOAL_TOTAL_RATIO, RunFigures


def done_line(f: RunFigures) -> str:
    lo, hi = f.spread("shard_max" if f.shard_shares else "share")
    head = (
        f"busiest process {f.busiest_process:.4f} (router {f.share:.4f}, busiest shard "
        f"{f.busiest:.4f}, slices {lo:.4f}-{hi:.4f}), total {f.total:.4f}"
        if f.shard_shares
        else f"share {f.share:.4f} (slices {lo:.4f}-{hi:.4f})"
    )
    q = [s.queued for s in f.slices]
    return (
        f"  done: {f.workload} {f.batch} {f.policy}: window {f.window[0]:.1f}-"
        f"{f.window[1]:.1f} sim s, {f.decisions:,} decisions, queued {min(q)}-{max(q)} at the "
        f"slices' ends, {head}, latency p50/p99 "
        f"{f.latency_ms[0]:.3f}/{f.latency_ms[1]:.3f} ms, wall {f.wall_s:.0f} s, CPU "
        f"{f.run_cpu_s:.0f} s"
    )


def summary_line(row: dict) -> str:
    """The goals at one batch: the sharded layout's busiest process, and its total against
    the one process of the same run."""
    sh = row["heuristic/sharded"]
    one = row["heuristic/scoped"]
    ratio = row["sharded_total_over_one_process"]
    return (
        f"{row['workload']} at batch {row['batch']:,}: sharded, busiest process "
        f"{sh['busiest_process_cpu_per_s']:.4f} of a core (router "
        f"{sh['router_cpu_per_s']:.4f}, busiest shard {sh['busiest_shard_cpu_per_s']:.4f}; "
        f"goal <= {GOAL_SHARE}): {'met' if row['sharded_busiest_process_met'] else 'NOT met'}; "
        f"total {sh['total_cpu_per_s']:.4f} = {ratio:.2f}x the one process's "
        f"{one['total_cpu_per_s']:.4f} (goal <= {GOAL_TOTAL_RATIO}x): "
        f"{'met' if row['sharded_total_met'] else 'NOT met'}"
    )


def table(figs: list[RunFigures], ref_ms: float) -> Table:
    t = Table(
        title=f"scheduler CPU per simulated second over the window (plain numpy DP "
        f"64x16x256 in the same run: {ref_ms:.3f} ms CPU; min: same-run reference)"
    )
    for c in (
        "workload",
        "batch",
        "config",
        "window sim s",
        "decisions",
        "queued (slice ends)",
        "busiest process",
        "total",
        "one process / router",
        "busiest shard (slices)",
        "shards",
        "latency p50 / p99 ms",
        "RSS MB",
        "wall s",
        "run CPU s",
    ):
        t.add_column(c)
    for f in figs:
        lo, hi = f.spread("shard_max" if f.shard_shares else "share")
        t.add_row(
            f.workload,
            f"{f.batch:,}",
            f.policy,
            f"{f.window[0]:.0f}-{f.window[1]:.0f}",
            f"{f.decisions:,}",
            f"{min(s.queued for s in f.slices)}-{max(s.queued for s in f.slices)}",
            f"{f.busiest_process:.4f}",
            f"{f.total:.4f}",
            f"{f.share:.4f}" + ("" if f.shard_shares else f" ({lo:.4f}-{hi:.4f})"),
            f"{f.busiest:.4f} ({lo:.4f}-{hi:.4f})" if f.shard_shares else "-",
            f"{len(f.shard_shares)}" if f.shard_shares else "-",
            f"{f.latency_ms[0]:.3f} / {f.latency_ms[1]:.3f}",
            f"{f.peak_rss_mb:,.0f}",
            f"{f.wall_s:.0f}",
            f"{f.run_cpu_s:.0f}",
        )
    return t


def document(figs: list[RunFigures], ref_ms: float, ns) -> dict:
    """The JSON: every run (`runs`), and per workload and batch the layouts side by side
    (`layouts`, the figures docs/scale.md "The JSON" names)."""
    runs = []
    for f in figs:
        d = asdict(f)
        d["busiest_shard"] = f.busiest
        d["spread"] = f.spread("shard_max" if f.shard_shares else "share")
        d.update(layout_figures(f))
        runs.append(d)
    return {
        "reference_dp_ms": ref_ms,
        "goal_share": GOAL_SHARE,
        "goal_total_ratio": GOAL_TOTAL_RATIO,
        "warmup_s": ns.warmup,
        "window_s": ns.window,
        "slices": ns.slices,
        "nodes_per_shard": ns.nodes_per_shard,
        "runs": runs,
        "layouts": side_by_side(figs),
    }


def layout_figures(f: RunFigures) -> dict:
    """One run's figures under the keys a reader looks for: CPU seconds per simulated second
    over the window, and submit-to-grant wall latency."""
    return {
        "busiest_process_cpu_per_s": f.busiest_process,
        "total_cpu_per_s": f.total,
        "router_cpu_per_s": f.share if f.shard_shares else None,
        "busiest_shard_cpu_per_s": f.busiest if f.shard_shares else None,
        "processes": 1 + len(f.shard_shares),
        "submit_to_grant_p50_ms": f.latency_ms[0],
        "submit_to_grant_p99_ms": f.latency_ms[1],
    }


def side_by_side(figs: list[RunFigures]) -> list[dict]:
    """Per (workload, batch): every layout's figures, and the sharded layout against the one
    process (`heuristic/scoped`) of the same run, with the goals."""
    out = []
    for key in sorted({(f.workload, f.batch) for f in figs}):
        runs = {f.policy: f for f in figs if (f.workload, f.batch) == key}
        row: dict = {"workload": key[0], "batch": key[1]}
        for label, f in runs.items():
            row[label] = layout_figures(f)
        one, sharded = runs.get("heuristic/scoped"), runs.get("heuristic/sharded")
        if one is not None and sharded is not None:
            ratio = sharded.total / one.total if one.total > 0 else None
            row["sharded_total_over_one_process"] = ratio
            row["sharded_busiest_process_met"] = sharded.busiest_process <= GOAL_SHARE
            row["sharded_total_met"] = ratio is not None and ratio <= GOAL_TOTAL_RATIO
        out.append(row)
    return out


def plot(figs: list[RunFigures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for w in sorted({f.workload for f in figs}):
        for pol in sorted({f.policy for f in figs}):
            xs = [f for f in figs if (f.workload, f.policy) == (w, pol)]
            if not xs:
                continue
            ys = [f.busiest if f.shard_shares else f.share for f in xs]
            label = f"{w} / {pol}" + (" (busiest shard)" if xs[0].shard_shares else "")
            ax.plot([f.batch for f in xs], ys, "o-", label=label)
    ax.axhline(GOAL_SHARE, color="grey", lw=0.8, ls=":", label="goal 0.10")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (trajectories)")
    ax.set_ylabel("scheduler CPU s per simulated s (window)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
