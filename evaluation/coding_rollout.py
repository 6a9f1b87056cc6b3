"""The paper's AI-coding workload, for real: one task image, a GRPO group forked from it, the
project's own test suite as the elastic reward.

1. Build a task image without a registry (`managers.cpu.build`, each step cached): the host's
   Python, pytest and pytest-xdist from PyPI, and a real open-source project with its own tests
   (six 1.17.0, its sdist from PyPI: `six.py` and `test_six.py`) with a bug planted in it.
2. Open one environment from the image and run the suite: the bug fails it.
3. Fork a group of 8 from that environment (files only; O(1) in data).
4. Apply a different patch in each sample (some fix the bug, some do not, one does not even
   parse), through the files API.
5. Run each sample's test suite as an elastic action through the scheduler (1 to 2 cores,
   pytest-xdist gets the grant) and score it: reward 1 when the whole suite passes, else 0
   (as SWE-bench's "resolved"), with the fraction of tests passed beside it.

`run()` returns the rows; `examples/ai_coding_rollout.py` and `tangram demo --rollout coding`
print them.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from managers.cpu.build import build
from tangram import Tangram

PROJECT = "six==1.17.0"
WORK = "/sandbox/six"
PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"
BUGGY = "        return iter(d.keys(**kw))  # planted bug: iteritems gives the keys"
LINE = "        return iter(d.items(**kw))"
PATCHES = {  # sample -> the line put where the bug is
    "fix": LINE,
    "fix-generator": "        return (kv for kv in d.items(**kw))",
    "fix-copy": "        return iter(list(d.items(**kw)))",
    "no-iter": "        return d.items(**kw)",
    "values": "        return iter(d.values(**kw))",
    "as-list": "        return list(d.items(**kw))",
    "unchanged": BUGGY,
    "syntax-error": "        return iter(d.items(**kw)",
}
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def _project(folder: Path) -> Path:
    """The project's sdist from PyPI (pip's cache when it is there), unpacked, bug planted."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-d",
            str(folder),
            PROJECT,
        ],
        check=True,
    )
    sdist = next(folder.glob("six-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(folder, filter="data")
    src = next(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("six-"))
    code = (src / "six.py").read_text()
    first = code.index(LINE)  # the Python 3 branch's iteritems
    (src / "six.py").write_text(code[:first] + BUGGY + code[first + len(LINE) :])
    return src


def task_image(tg: Tangram, name: str = "coding-six", log=print) -> str:
    """Build (or find cached) the task image; returns its digest."""
    assert tg.cpu is not None and tg.cpu.roots is not None, "needs the bwrap backend"
    with tempfile.TemporaryDirectory() as tmp:
        src = _project(Path(tmp))
        image = build(
            tg.cpu.roots.images,
            name,
            [
                {
                    "host": {
                        "programs": ["sh", "cat", "ls", "rm", "python3", PYTHON],
                        "folders": [f"/usr/lib/{PYTHON}"],
                    }
                },
                {"pip": ["pytest==9.2.0", "pytest-xdist==3.8.0"]},
                {"copy": {"from": str(src), "to": WORK}},
            ],
            log=log,
        )
    return image.digest


def reward_of(stdout: str) -> tuple[float, int, int]:
    """(passed fraction, passed, not passed) from pytest's summary line."""
    counts = {"passed": 0, "failed": 0, "error": 0}
    for n, what in SUMMARY.findall(stdout.strip().splitlines()[-1] if stdout.strip() else ""):
        counts["error" if what.startswith("error") else what] += int(n)
    bad = counts["failed"] + counts["error"]
    total = counts["passed"] + bad
    return (counts["passed"] / total if total else 0.0), counts["passed"], bad


async def _score(tg: Tangram, env: str) -> dict[str, Any]:
    r = await tg.exec(
        env,
        f"cd {WORK} && {PYTHON} -m pytest -q -p no:cacheprovider test_six.py",
        cpu=(1, 2),
        elastic=True,
        timeout=300,
    )
    fraction, passed, bad = reward_of(r.stdout)
    return {
        "reward": 1.0 if r.exit_code == 0 and bad == 0 and passed else 0.0,
        "fraction": round(fraction, 4),
        "passed": passed,
        "not_passed": bad,
        "exit_code": r.exit_code,
        "cores": r.units.get("cpu"),
        "queued_s": r.queued_s,
        "run_s": r.run_s,
    }


async def rollout(tg: Tangram, group: int = 8, log=print) -> dict[str, Any]:
    t0 = time.perf_counter()
    digest = await asyncio.to_thread(task_image, tg, log=log)
    t_image = time.perf_counter() - t0
    t = time.perf_counter()
    root = await tg.open_env("coding-task", memory_mb=512, image=digest, disk_mb=256)
    t_open = time.perf_counter() - t
    base = await _score(tg, root)
    t = time.perf_counter()
    names = list(PATCHES)[:group]
    samples = await tg.fork_env(root, [f"coding-sample-{i}" for i in range(len(names))])
    t_fork = time.perf_counter() - t
    source = (await tg.read_files(root, [f"{WORK}/six.py"]))[f"{WORK}/six.py"]
    assert source is not None and BUGGY.encode() in source
    for env, name in zip(samples, names):
        patched = source.replace(BUGGY.encode(), PATCHES[name].encode())
        await tg.write_files(env, {f"{WORK}/six.py": patched})
    t = time.perf_counter()
    scores = await asyncio.gather(*(_score(tg, env) for env in samples))
    t_rewards = time.perf_counter() - t
    for env in [root, *samples]:
        await tg.close_env(env)
    return {
        "image": digest,
        "image_s": t_image,
        "open_s": t_open,
        "fork_s": t_fork,
        "rewards_s": t_rewards,
        "base": base,
        "samples": [{"sample": i, "patch": n, **s} for i, (n, s) in enumerate(zip(names, scores))],
    }


def run(group: int = 8, state_dir: str | None = None, log=print) -> dict[str, Any]:
    """The whole rollout on this machine (bwrap backend: root and bubblewrap)."""
    cpu: dict[str, Any] = {"backend": "bwrap"}
    if state_dir:
        cpu["state_dir"] = state_dir

    async def go() -> dict[str, Any]:
        async with Tangram.from_dict({"cpu": cpu}) as tg:
            return await rollout(tg, group, log)

    return asyncio.run(go())


def render(out: dict[str, Any]) -> str:
    lines = [
        f"task image {out['image'][:19]} ready in {out['image_s']:.1f} s; environment "
        f"opened in {out['open_s'] * 1e3:.0f} ms; before any patch: reward "
        f"{out['base']['reward']:.0f} ({out['base']['not_passed']} of "
        f"{out['base']['passed'] + out['base']['not_passed']} tests not passed)",
        f"forked a group of {len(out['samples'])} in {out['fork_s'] * 1e3:.0f} ms; "
        f"rewards of all samples in {out['rewards_s']:.1f} s (in parallel, through the "
        f"scheduler)",
        f"{'sample':>6}  {'patch':<14}{'reward':>7}{'tests ok':>9}{'passed':>8}{'failed':>8}"
        f"{'cores':>7}{'queued s':>10}{'run s':>8}",
    ]
    for s in out["samples"]:
        lines.append(
            f"{s['sample']:>6}  {s['patch']:<14}{s['reward']:>7.0f}"
            f"{s['fraction']:>9.3f}{s['passed']:>8}"
            f"{s['not_passed']:>8}{s['cores'] or '-':>7}{s['queued_s']:>10.2f}"
            f"{s['run_s']:>8.2f}"
        )
    lines.append(
        "left behind: the task image 'coding-six' and its build steps' caches in the node's "
        "image store (reused by the next run); `tangram image ls` lists them, "
        "`tangram image rm coding-six` removes the image. Environments are all closed."
    )
    return "\n".join(lines)
