"""The twin's workloads (`tangram experiment twin`, `evaluation.twin`): their commands (tool
calls `head -c N /dev/zero | sha256sum` on one core; a reward, a Python program forking one
worker per granted core over a serial and a parallel part; in the mixed workload, calls of an
HTTP API on loopback with a latency and a concurrency limit) and their plans (trajectories,
turns and LLM gaps drawn as the AI-coding workload draws them, `evaluation.workloads.coding`).

Two workloads (`WORKLOADS`): `coding` (tool calls, then the reward) and `mixed` (each turn a
tool call or an API call, even odds, then the reward); two loads (`LOADS`): `fit` (as many
trajectories as cores) and `over` (twice as many)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from evaluation.workloads.base import lognormal_mean
from evaluation.workloads.coding import CodingParams
from managers.cpu.request import Command

REWARD_PROGRAM = r"""
import os, sys
n = len(os.sched_getaffinity(0))
serial, par = int(float(sys.argv[1])), int(float(sys.argv[2]))
def spin(k):
    x = 0
    for i in range(k):
        x += i
spin(serial)
kids = []
for _ in range(n - 1):
    pid = os.fork()
    if pid == 0:
        spin(par // n)
        os._exit(0)
    kids.append(pid)
spin(par // n)
for pid in kids:
    os.waitpid(pid, 0)
"""
TIMEOUT_S = 60.0  # every exec's timeout, in the runtime and in the simulated actions
API = "search"  # the mixed workload's API (resource `api:search`)
API_KIND = "api:search"
WORKLOADS = ("coding", "mixed")
LOADS = {"fit": 1, "over": 2}  # trajectories per core


@dataclass(frozen=True)
class TwinParams:
    trajectories: int = 8  # overridden per load: cores x `LOADS[load]`
    turns_mean: float = 5.0  # tool calls per trajectory (lognormal as in AI coding)
    tool_bytes: tuple[int, ...] = (100_000_000, 200_000_000, 400_000_000)
    reward_serial: float = 2e6  # loop iterations of the reward's serial part
    reward_parallel: float = 3e7  # ... and of its parallel part, split over the granted cores
    think_scale: float = 0.1  # LLM generation gaps of the coding workload, scaled down
    start_spread_s: float = 2.0
    max_dop: int = 4
    reps: int = 3  # calibration rounds (each command alone, each kind beside its copies)
    corun_max: int = 2  # calibrate co-runs up to this many copies per core
    runs: int = 3  # real runs per workload and load, each after its own calibration
    seed: int = 0
    workload: str = "coding"  # or "mixed" (`WORKLOADS`)
    api_latency_s: float = 0.2  # the loopback API server's answer time
    api_concurrency: int = 2  # calls the API pool lets in flight (Tangram's gate)


QUICK = TwinParams(
    turns_mean=3.0,
    tool_bytes=(60_000_000, 120_000_000),
    reward_parallel=8e6,
    think_scale=0.05,
    start_spread_s=0.5,
    reps=2,
    runs=1,
)


@dataclass(frozen=True)
class TwinStep:
    think_s: float
    command: Command | None  # None: a call of the API
    elastic: bool


@dataclass(frozen=True)
class TwinTrajectory:
    id: str
    start: float
    steps: tuple[TwinStep, ...]


def tool_command(nbytes: int) -> str:
    return f"head -c {nbytes} /dev/zero | sha256sum"


def reward_command(p: TwinParams) -> tuple[str, ...]:
    return ("python3", "-c", REWARD_PROGRAM, f"{p.reward_serial:g}", f"{p.reward_parallel:g}")


def plan(p: TwinParams) -> list[TwinTrajectory]:
    """The workload: turns and LLM generation gaps drawn as the AI-coding workload draws them
    (`CodingParams`' distributions), tool sizes uniformly from `tool_bytes`."""
    c = CodingParams()
    rng = random.Random(p.seed)
    out = []
    for i in range(p.trajectories):
        turns = max(1, round(lognormal_mean(rng, p.turns_mean, c.turns_sigma)))
        steps = []
        for _ in range(turns):
            tokens = lognormal_mean(rng, c.output_tokens_mean, c.output_tokens_sigma)
            tool = tool_command(rng.choice(p.tool_bytes))
            api = p.workload == "mixed" and rng.random() < 0.5
            steps.append(
                TwinStep(p.think_scale * tokens / c.decode_tok_s, None if api else tool, False)
            )
        steps.append(TwinStep(0.0, reward_command(p), True))
        out.append(TwinTrajectory(f"twin{i}", rng.uniform(0, p.start_spread_s), tuple(steps)))
    return out


def twin_kind(command: Command | None) -> str:
    """The trusted kind the twin gives each command (its program's name; an API call's
    `api:<name>`), on both sides."""
    if command is None:
        return API_KIND
    first = (command.split() or ["?"])[0] if isinstance(command, str) else command[0]
    return first.rsplit("/", 1)[-1]
