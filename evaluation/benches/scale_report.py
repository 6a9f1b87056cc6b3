"""What `tangram bench scale` prints and writes: a run's one line, the table, the JSON document
and the plot (the bench itself: `evaluation.benches.scale`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from evaluation.benches.scale_run import GOAL_SHARE, RunFigures


def done_line(f: RunFigures) -> str:
    lo, hi = f.spread("shard_max" if f.shard_shares else "share")
    head = (
        f"busiest shard {f.busiest:.4f} (slices {lo:.4f}-{hi:.4f}), router {f.share:.4f}"
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
    runs = []
    for f in figs:
        d = asdict(f)
        d["busiest_shard"] = f.busiest
        d["spread"] = f.spread("shard_max" if f.shard_shares else "share")
        runs.append(d)
    return {
        "reference_dp_ms": ref_ms,
        "goal_share": GOAL_SHARE,
        "warmup_s": ns.warmup,
        "window_s": ns.window,
        "slices": ns.slices,
        "nodes_per_shard": ns.nodes_per_shard,
        "runs": runs,
    }


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
