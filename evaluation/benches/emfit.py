"""`tangram bench emfit [--runs N] [--tests N]`: E(m) learned on a real elastic pytest run.

Writes a small CPU-bound pytest suite, then runs it `--runs` times through `Tangram.local()`
as an elastic action (`cpu=(1, max)`, `pytest -n <granted cores>`; every third run on one core,
fixed). After every run it prints
the cores granted, the observed run time, and what the kind's fitted speedup curve
(`tangram.profiles.AmdahlFit`, prior serial fraction 0.25) now predicts at each core count, so
one sees the fit move from the prior to what this machine does.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os

from tangram.profiles import PRIOR_SERIAL, PRIOR_T_ORI, exec_kind
from tangram.runtime.facade import Tangram

TEST = """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_work(i):
    x = 0
    for k in range({loops}):
        x += k * k % 7
    assert x >= 0
"""


async def bench(runs: int, tests: int, loops: int, cores: int) -> list[dict]:
    out = []
    # the suite is written inside the environment (a sandbox sees only its own work dir)
    b64 = base64.b64encode(TEST.format(n=tests, loops=loops).encode()).decode()
    async with Tangram.local() as tg:
        env = await tg.open_env("emfit", memory_mb=512)
        kind = exec_kind("emfit", "", "emfit-suite")  # a trusted kind: the bench's own
        made = await tg.exec(env, f"echo {b64} | base64 -d > test_suite.py", timeout=30)
        if made.exit_code != 0:
            raise RuntimeError(f"could not write the suite: {made.stderr}")
        # this interpreter (as the sandbox sees it): it has pytest and pytest-xdist
        cmd = '"$TANGRAM_PYTHON" -m pytest -q -p no:cacheprovider test_suite.py'
        await tg.exec(
            env, cmd, cpu=(1, cores), elastic=True, timeout=300, kind="emfit-suite"
        )  # warm-up
        tg.scheduler.profiles.speedup(kind, PRIOR_SERIAL, PRIOR_T_ORI).reset()
        for i in range(runs):
            # every third run on one core (a fixed grant of the same kind): the fit needs
            # more than one amount, and an idle machine always grants the elastic run all
            single = i % 3 == 1
            r = await tg.exec(
                env,
                cmd,
                cpu=1 if single else (1, cores),
                elastic=not single,
                timeout=300,
                kind="emfit-suite",
            )
            fit = tg.scheduler.profiles.speedup(kind, PRIOR_SERIAL, PRIOR_T_ORI)
            t, s = fit.params()
            out.append(
                {
                    "run": i,
                    "status": str(r.status),
                    "cores": r.units.get("cpu"),
                    "observed_s": round(r.run_s, 3),
                    "fit_t_ori_s": round(t, 3),
                    "fit_serial": round(s, 3),
                    "predicted_s": {m: round(fit.predict(m), 3) for m in range(1, cores + 1)},
                }
            )
        await tg.close_env(env)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram bench emfit", description=__doc__)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--tests", type=int, default=24)
    p.add_argument("--loops", type=int, default=300_000)
    p.add_argument("--cores", type=int, default=min(4, os.cpu_count() or 1))
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)
    rows = asyncio.run(bench(ns.runs, ns.tests, ns.loops, ns.cores))
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        pred = "  ".join(f"{m}c:{v:.2f}s" for m, v in r["predicted_s"].items())
        print(
            f"run {r['run']}: {r['cores']} cores, observed {r['observed_s']:.2f} s "
            f"({r['status']}); fit T_ori {r['fit_t_ori_s']:.2f} s, serial "
            f"{r['fit_serial']:.2f}; predicts {pred}"
        )
    return 0
