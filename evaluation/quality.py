"""Policy against policy on seeded random instances, and a search for the worst case.

    python -m evaluation.quality ratio heuristic min --kind online --instances 500
    python -m evaluation.quality ratio heuristic heuristic:allow_wait=false --kind bursty
    python -m evaluation.quality search heuristic min --kind batch --budget 3000
    python -m evaluation.quality conservation --instances 60

`ratio` prints, over `--instances` seeded instances of a kind, the distribution of
total ACT(A) / total ACT(B): median, mean, the share of instances where A is worse, and the
worst ratio with its seed. `search` looks for the instance that maximises that ratio: seeded
random starts, each improved by hill climbing (one action's amounts, work or efficiencies
changed at a time, kept when the ratio grows), and prints the worst instance found as an
instance file (`tangram replay` it). A search finds a lower bound on the worst case, never a
proof of an upper one.

`conservation` counts, per runtime policy alone (the scheduler's work-conservation rule off),
the random flat instances with arrivals on which some action waited while every amount it
allows was free and nothing ahead of it was blocked (`tangram.conservation`), and the idle
unit-seconds.

Kinds: `online` and `batch` (one flat pool of 2-16 units, 2-12 Amdahl-elastic actions arriving
over time or all at 0: the heuristic's quality tests), `spread` and `bursty` (the gap study's
flat classes, `solvers.exact.random_instances`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable

from evaluation.replay import check_result
from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.exact.random_instances import InstanceClass, random_instance_doc
from solvers.registry import runtime_policies
from tangram.allocation import Allocator
from tangram.instance import parse_instance
from tangram.profiles import amdahl_efficiency

KINDS = ("online", "batch", "spread", "bursty")


def amdahl_doc(rng: random.Random, online: bool) -> dict:
    """One flat pool, Amdahl-elastic actions (serial fraction 0-0.3), arrivals over time or
    all at 0."""
    units = rng.randint(2, 16)
    acts, t = [], 0.0
    for i in range(rng.randint(2, 12)):
        if online:
            t += rng.choice([0.0, 0.0, 0.3, 1.0])
        amounts = sorted({1, *[rng.randint(1, units) for _ in range(rng.randint(0, 4))]})
        alpha = rng.uniform(0, 0.3)
        eff = {str(m): amdahl_efficiency(m, alpha) for m in amounts}
        acts.append(
            {
                "id": f"a{i}",
                "arrival": t,
                "key": "cpu",
                "demand": {"cpu": amounts},
                "t_ori": rng.uniform(1, 10),
                "efficiency": eff,
            }
        )
    return {"resources": {"cpu": {"topology": "flat", "units": units}}, "actions": acts}


def flat_arrivals_doc(rng: random.Random) -> dict:
    """One flat pool of 2-8 units, 2-10 actions arriving over time, fixed and elastic (any
    efficiencies): the instances of the work-conservation count."""
    units = rng.randint(2, 8)
    acts, t = [], 0.0
    for i in range(rng.randint(2, 10)):
        t += rng.choice([0.0, 0.0, 0.25, 0.5, 1.0])
        amounts = sorted({rng.randint(1, units) for _ in range(rng.randint(1, 3))})
        a: dict = {"id": f"a{i}", "arrival": t, "demand": {"cpu": amounts}}
        if len(amounts) > 1 or rng.random() < 0.3:
            a.update(
                key="cpu",
                t_ori=rng.uniform(0.5, 5),
                efficiency={str(m): rng.uniform(0.4, 1.0) if m > 1 else 1.0 for m in amounts},
            )
        else:
            a["duration"] = rng.uniform(0.1, 3)
        acts.append(a)
    return {"resources": {"cpu": {"topology": "flat", "units": units}}, "actions": acts}


def conservation(n: int, seed: int, policies: list[str]) -> dict[str, tuple[int, float]]:
    """policy -> (instances with waste, idle unit-seconds) over seeds seed..seed+n-1."""
    out = {}
    for name in policies:
        bad, idle = 0, 0.0
        for s in range(seed, seed + n):
            inst = parse_instance(flat_arrivals_doc(random.Random(s)))
            report = check_result(inst, simulate(inst, get_allocator(name), conserve=False))
            bad += bool(report)
            idle += report.idle_unit_seconds
        out[name] = (bad, idle)
    return out


def instance_doc(kind: str, seed: int, size: int = 6) -> dict:
    if kind in ("online", "batch"):
        return amdahl_doc(random.Random(seed), kind == "online")
    return random_instance_doc(InstanceClass("flat", kind, size), seed)


def policy(spec: str) -> Callable[[], Allocator]:
    """`name` or `name:key=value,...` (values: int, float, true/false)."""
    name, _, rest = spec.partition(":")
    options: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        low = v.lower()
        options[k] = (
            (low == "true")
            if low in ("true", "false")
            else (int(v) if v.lstrip("-").isdigit() else float(v))
        )
    get_allocator(name, **options)  # a bad name or option fails here, naming it
    return lambda: get_allocator(name, **options)


def ratio_of(doc: dict, a: Callable[[], Allocator], b: Callable[[], Allocator]) -> float:
    inst = parse_instance(doc)
    return simulate(inst, a()).total_act / simulate(inst, b()).total_act


def ratios(kind: str, n: int, seed: int, a, b) -> dict:
    rs = [(ratio_of(instance_doc(kind, s), a, b), s) for s in range(seed, seed + n)]
    worst = max(rs)
    vals = [r for r, _ in rs]
    return {
        "instances": n,
        "median": statistics.median(vals),
        "mean": statistics.mean(vals),
        "worse_share": sum(r > 1 + 1e-9 for r in vals) / n,
        "worst": worst[0],
        "worst_seed": worst[1],
    }


def _mutate(rng: random.Random, doc: dict) -> dict:
    new = json.loads(json.dumps(doc))
    acts = new["actions"]
    units = new["resources"]["cpu"]["units"]
    a = rng.choice(acts)
    what = rng.randrange(3)
    if what == 0:  # its amounts
        a["demand"]["cpu"] = sorted({1, *[rng.randint(1, units) for _ in range(rng.randint(0, 3))]})
        alpha = rng.uniform(0, 0.5)
        a["efficiency"] = {str(m): amdahl_efficiency(m, alpha) for m in a["demand"]["cpu"]}
    elif what == 1:  # its work
        a["t_ori"] = max(0.05, a["t_ori"] * rng.uniform(0.5, 2.0))
    else:  # one efficiency, kept in (0, 1] and at 1 for one unit
        m = rng.choice(a["demand"]["cpu"])
        if m > 1:
            a["efficiency"][str(m)] = min(
                1.0, max(0.05, a["efficiency"][str(m)] * rng.uniform(0.7, 1.3))
            )
    return new


def search(kind: str, budget: int, seed: int, a, b, starts: int = 0) -> tuple[float, dict]:
    """The worst ratio found within `budget` simulations pairs: `starts` random instances
    (a quarter of the budget by default), then hill climbing from the worst few."""
    rng = random.Random(seed)
    starts = starts or max(1, budget // 4)
    pool = sorted(
        (
            (ratio_of(d := instance_doc(kind, seed * 100_003 + i), a, b), i, d)
            for i in range(starts)
        ),
        key=lambda x: -x[0],
    )[:5]
    best_r, _, best = pool[0]
    left = budget - starts
    for r, _, doc in pool:
        for _ in range(left // len(pool)):
            cand = _mutate(rng, doc)
            try:
                cr = ratio_of(cand, a, b)
            except Exception:  # a mutation may make an invalid instance
                continue
            if cr > r:
                r, doc = cr, cand
        if r > best_r:
            best_r, best = r, doc
    return best_r, best


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m evaluation.quality",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("ratio", "search"):
        q = sub.add_parser(name)
        q.add_argument("a", help="policy (name or name:key=value,...)")
        q.add_argument("b", help="the reference policy")
        q.add_argument("--kind", choices=KINDS if name == "ratio" else KINDS[:2], default="online")
        q.add_argument("--seed", type=int, default=0)
        if name == "ratio":
            q.add_argument("--instances", type=int, default=500)
        else:
            q.add_argument(
                "--budget",
                type=int,
                default=3000,
                help="instances simulated (each through both policies)",
            )
    q = sub.add_parser("conservation")
    q.add_argument("--instances", type=int, default=60)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument(
        "--policies",
        default=None,
        help="comma-separated (default: every runtime policy but cpsat, pulp)",
    )
    ns = p.parse_args(argv)
    if ns.cmd == "conservation":
        names = (
            ns.policies.split(",")
            if ns.policies
            else [n for n in runtime_policies() if n not in ("cpsat", "pulp")]
        )
        for name, (bad, idle) in conservation(ns.instances, ns.seed, names).items():
            print(
                f"{name}: waste on {bad} of {ns.instances} instances (seeds {ns.seed}-"
                f"{ns.seed + ns.instances - 1}), {idle:.2f} idle unit-seconds"
            )
        return 0
    a, b = policy(ns.a), policy(ns.b)
    if ns.cmd == "ratio":
        out = ratios(ns.kind, ns.instances, ns.seed, a, b)
        print(
            f"{ns.a} / {ns.b}, {ns.kind}, seeds {ns.seed}-{ns.seed + ns.instances - 1}: "
            f"median {out['median']:.3f}, mean {out['mean']:.3f}, worse on "
            f"{100 * out['worse_share']:.1f}%, worst {out['worst']:.3f} (seed "
            f"{out['worst_seed']})"
        )
    else:
        r, doc = search(ns.kind, ns.budget, ns.seed, a, b)
        print(f"{ns.a} / {ns.b}, {ns.kind}: worst found {r:.3f} in {ns.budget} instances")
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
