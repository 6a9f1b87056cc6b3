"""The scoped scheduler's re-read rule for put-off classes (`tangram.rereads`) against the rule
before issue 28 (such a class read again at every decision of the cluster): the heuristic's
grants, decision by decision, on the scale bench's cluster up to a simulated time
(docs/scale.md, "Why 8,192 cost more than 16,384").

    python -m evaluation.rereadcheck 2048 --until 90    # batch 2,048, the bench's run (0-90 s)
"""

from __future__ import annotations

import argparse
import time

from evaluation.benches.scale_run import workload_for
from evaluation.closedloop import ClosedLoopSimulator, Policy
from evaluation.grant_recording import Recording
from solvers import get_allocator
from tangram.scheduler import Scheduler


class EveryDecision(Scheduler):
    """The rule before issue 28: a put-off class is in the next decision's scope, whatever
    happens (what made its cost the put-off classes times the cluster's decision rate)."""

    def _keep_put_off_in_scope(self, scope, now: float) -> None:
        super()._keep_put_off_in_scope(scope, now)
        self._touched.update(self._rereads.take(float("inf")))


class _Stop(Exception):
    pass


def _until(make, until: float):
    class Bounded(make):  # type: ignore[misc, valid-type]
        def decide(self, now: float):
            if now > until:
                raise _Stop
            return super().decide(now)

    return Bounded


def record(workload: str, batch: int, until: float, make) -> tuple[list[str], float]:
    """The heuristic's decisions up to `until` (scoped) with scheduler class `make`, and the
    wall seconds it took."""
    rec = Recording(get_allocator("heuristic"))
    w = workload_for(workload, batch)
    sim = ClosedLoopSimulator(
        w, Policy("heuristic", rec, scoped=True, make_scheduler=_until(make, until))
    )
    t0 = time.perf_counter()
    try:
        sim.run()
    except _Stop:
        pass
    return rec.lines, time.perf_counter() - t0


def compare(workload: str, batch: int, until: float) -> dict:
    old, old_s = record(workload, batch, until, EveryDecision)
    new, new_s = record(workload, batch, until, Scheduler)
    first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), None)
    if first is None and len(old) != len(new):
        first = min(len(old), len(new))
    return {
        "decisions": len(new),
        "grants": sum(line.count(":") for line in new),
        "first_difference": first,
        "wall_s": {"every decision": old_s, "rereads": new_s},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluation.rereadcheck", description=__doc__)
    p.add_argument("batch", type=int)
    p.add_argument("--workload", default="coding", choices=["coding", "mixed"])
    p.add_argument("--until", type=float, default=90.0, help="simulated seconds (default 90)")
    ns = p.parse_args(argv)
    r = compare(ns.workload, ns.batch, ns.until)
    print(
        f"{ns.workload} batch {ns.batch}, 0-{ns.until:g} s: {r['decisions']:,} decisions, "
        f"{r['grants']:,} grants; first difference: {r['first_difference']}; wall s: "
        f"every decision {r['wall_s']['every decision']:.1f}, rereads "
        f"{r['wall_s']['rereads']:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
