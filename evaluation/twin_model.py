"""The digital twin's model of this machine (`evaluation.twin`): what the simulator plays for a
workload, from calibration alone (`offline_workload`, `Contention`, `SampledStart`) or from
a real run's trace (`replay_workload`), and the simulation itself (`simulate`).

The offline model's terms, each one a switch of `Terms` (the ablations; `background` is off
by default, the others on):

- `profiles`: a command's run time alone at each core count it may get (the median of its
  calibration runs); without it, the run time measured with the machine full of the command
  (`cores` copies at once), as a calibration that knows nothing of neighbours would take it;
- `contention`: the slowdown beside neighbours, processor-sharing style
  (`evaluation.engine.Sharing`): at every start and end, each running command's remaining
  work progresses at rate s(m) / s(b), b the cores granted to all running commands, m its
  own, s its kind's measured slowdown at b copies (linear between, beyond the last point);
- `starts`: environment starts drawn from their measured distribution (else its median);
- `client`: the client's own latency per action (submission, the result's way back, a sleep
  waking late), its calibrated median added to each LLM gap;
- `background`: the other tenants' runnable threads, measured (/proc/stat's runnable count
  while the twin runs nothing) around calibration and again just before the run: their
  difference d shifts the level the slowdown is read at (s(b + d), beyond `cores` where
  d > 0: calibration measures up to 2 x cores copies), as other tenants' processes are
  neighbours too. Off by default: one reading before the run did not follow the tenants'
  load through it, and the twin's errors were smaller without it (docs/architecture.md,
  "The digital twin").
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evaluation.closedloop import EnvironmentStart, Policy, run
from evaluation.runtime_sim import run_on_runtime
from evaluation.twin_measure import Observed, Profile
from evaluation.twin_plan import API_KIND, TIMEOUT_S, TwinParams, TwinTrajectory, twin_kind
from evaluation.workloads.base import Step, Trajectory, Workload
from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.pools import CorePool, FlatPool, Pool
from tangram.profiles import exec_kind
from tangram.runtime.config import DEFAULT_POLICY
from topology import CpuNode


@dataclass(frozen=True)
class Terms:
    profiles: bool = True
    contention: bool = True
    starts: bool = True
    client: bool = True
    background: bool = False  # off by default: as the twin measures it, it added error


FULL = Terms()
ABLATIONS = {
    "no_profiles": Terms(profiles=False),
    "no_contention": Terms(contention=False),
    "no_starts": Terms(starts=False),
    "no_client": Terms(client=False),
    "with_background": Terms(background=True),
    "none": Terms(False, False, False, False, False),  # the twin's former offline model
}


class Contention:
    """`evaluation.engine.Sharing` from a profile: a CPU action of kind K at m cores, with b
    cores granted to everything running, progresses at s_K(m) / s_K(b + shift); others at 1.
    `shift`: the other tenants' runnable threads now less during calibration."""

    def __init__(
        self, slowdowns: Mapping[str, Sequence[float]], shift: float = 0.0, resource: str = "cpu"
    ) -> None:
        self.s = {k: tuple(v) for k, v in slowdowns.items()}
        self.shift = shift
        self.resource = resource

    def factor(self, kind: str, b: float) -> float:
        """s_kind(b): its slowdown at b busy cores (1 alone), linear between the measured
        points and beyond the last."""
        s = self.s.get(kind.removeprefix("kind:"))
        if not s or len(s) == 1 or b == 1:
            return 1.0
        lo = max(0, min(int(b - 1), len(s) - 2))  # below 1 (less background): the first slope
        return max(0.25, s[lo] + (s[lo + 1] - s[lo]) * (b - 1 - lo))

    def rates(self, running: Mapping[str, tuple[Action, Mapping[str, int]]]) -> dict[str, float]:
        r = self.resource
        b = sum(u.get(r, 0) for _, u in running.values()) + self.shift
        return {
            aid: self.factor(a.kind, units[r]) / self.factor(a.kind, b) if units.get(r) else 1.0
            for aid, (a, units) in running.items()
        }


class SampledStart(EnvironmentStart):
    """Environment starts from their measured distribution: the first trajectory to begin
    pays the runtime's first (`cold`) start, the others a seeded draw from the samples."""

    def __init__(self, samples: Sequence[float], cold: float | None = None, seed: int = 0):
        super().__init__(statistics.median(samples))
        self.samples, self.cold = list(samples), cold
        self.rng = random.Random(seed)

    def start(self, traj: Trajectory, now: float) -> float | None:
        if self.cold is not None:
            cold, self.cold = self.cold, None
            return cold
        return self.rng.choice(self.samples)


def elastic_action(aid: str, run_s: Mapping[int, float], trajectory: str, kind: str) -> Action:
    """An elastic action that runs `run_s[m]` seconds on m cores, exactly: T_ori is the least
    m x run_s[m], so no efficiency exceeds 1 even where the measured times are superlinear
    (noise), and none is clipped (a clipped one would play a longer time than measured)."""
    t_ori = min(m * t for m, t in run_s.items())
    eff = {m: min(1.0, t_ori / (m * t)) for m, t in run_s.items()}
    return Action(
        aid,
        {"cpu": sorted(run_s)},
        elasticity=Elasticity("cpu", t_ori, eff),
        trajectory=trajectory,
        kind=kind,
        timeout=TIMEOUT_S,
    )


def _pools(node: CpuNode, p: TwinParams, api: bool):
    def pools() -> dict[str, Pool]:
        out: dict[str, Pool] = {"cpu": CorePool("cpu", {node.name: node.copy()})}
        if api:
            out[API_KIND] = FlatPool(API_KIND, {"api": p.api_concurrency})
        return out

    return pools


def _one(aid: str, tid: str, command, run_s: float) -> Action:
    if command is None:
        return Action(aid, {API_KIND: 1}, duration=run_s, trajectory=tid, kind=API_KIND)
    kind = exec_kind(tid, command, twin_kind(command))
    return Action(aid, {"cpu": 1}, duration=run_s, trajectory=tid, kind=kind, timeout=TIMEOUT_S)


def _alone(prof: Profile, terms: Terms) -> dict:
    """Run seconds per (command, cores): alone, or (no `profiles`) beside `cores` copies."""
    run_s = prof.run_s
    if terms.profiles:
        return run_s
    c = prof.node.capacity
    full = {k: s[min(c, len(s)) - 1] for k, s in ((k, prof.slowdown(k)) for k in prof.corun)}
    return {(c, m): t * full.get(twin_kind(c), 1.0) for (c, m), t in run_s.items()}


def offline_workload(
    trajs: Sequence[TwinTrajectory], prof: Profile, p: TwinParams, terms: Terms = FULL
) -> Workload:
    """The plan for the simulator from calibration alone."""
    run_s, extra = _alone(prof, terms), prof.overhead_s if terms.client else 0.0
    out = []
    for t in trajs:
        steps = []
        for j, s in enumerate(t.steps):
            aid = f"{t.id}.{j}"
            if s.elastic and len(prof.dops) > 1:
                kind = exec_kind(t.id, s.command, twin_kind(s.command))
                act = elastic_action(aid, {m: run_s[(s.command, m)] for m in prof.dops}, t.id, kind)
            else:
                t_s = prof.api_s if s.command is None else run_s[(s.command, 1)]
                act = _one(aid, t.id, s.command, t_s)
            steps.append(Step(s.think_s + (extra if j else 0.0), act))
        out.append(Trajectory(t.id, "coding", t.start, tuple(steps)))
    api = any(s.command is None for t in trajs for s in t.steps)
    return Workload("twin", tuple(out), _pools(prof.node, p, api), None, tasks=("coding",))


def replay_workload(real: Observed, prof: Profile, p: TwinParams) -> Workload:
    """The real run's trajectories for the simulator: each starts when its environment was
    opened, each action is submitted after its measured gap (sleep overshoot and the client's
    own latency included), and runs its own measured time at the cores it got (at other core
    counts, an elastic one's time scaled by its calibrated speed-up)."""
    assert real.trace is not None
    out, alone = [], prof.run_s
    for tid, (start, done) in real.trace.items():
        steps = []
        for j, d in enumerate(done):
            aid = f"{tid}.{j}"
            if d.elastic and len(prof.dops) > 1:
                kind = exec_kind(tid, d.command, twin_kind(d.command))
                scale = d.run_s / alone[(d.command, d.cores)]
                t = {m: scale * alone[(d.command, m)] for m in prof.dops}
                act = elastic_action(aid, t, tid, kind)
            else:
                act = _one(aid, tid, d.command, d.run_s)
            steps.append(Step(d.gap, act))
        out.append(Trajectory(tid, "coding", start, tuple(steps)))
    api = any(d.command is None for _, dd in real.trace.values() for d in dd)
    return Workload("twin", tuple(out), _pools(prof.node, p, api), None, tasks=("coding",))


def simulate(
    w: Workload, cores: int, start: EnvironmentStart, sharing=None, on_runtime: bool = False
) -> Observed:
    """The simulator's figures for `w`: the closed-loop engine, or (`on_runtime`) the runtime
    itself on virtual time with the sim backend (`evaluation.runtime_sim`; no sharing there,
    replays only: the two grant alike)."""
    if on_runtime:
        r = run_on_runtime(w, DEFAULT_POLICY, start.start_s)
    else:
        r = run(w, Policy("tangram", get_allocator(DEFAULT_POLICY), start), sharing=sharing)
    busy = sum(x.units.get("cpu", 0) * (x.end - x.start) for x in r.records.values())
    return Observed(
        [x.end - x.arrival for x in r.records.values()],
        [x.end - x.start for x in r.records.values()],
        busy,
        r.makespan,
        cores,
    )


def predict(
    trajs: Sequence[TwinTrajectory],
    prof: Profile,
    p: TwinParams,
    terms: Terms = FULL,
    seed: int = 0,
    background: float | None = None,
) -> Observed:
    """The offline prediction: the plan with the calibrated profile alone (`terms` on);
    `background`: the other tenants' runnable threads just before the run."""
    w = offline_workload(trajs, prof, p, terms)
    start = (
        SampledStart(prof.opens, prof.cold_open, seed)
        if terms.starts
        else EnvironmentStart(prof.open_s)
    )
    sharing = None
    if terms.contention:
        shift = background - prof.background if terms.background and background is not None else 0
        sharing = Contention({k: prof.slowdown(k) for k in prof.corun}, shift)
    return simulate(w, prof.node.capacity, start, sharing)
