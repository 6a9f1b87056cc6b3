"""The CPU action builder: an `exec` call turned into the `Action` the scheduler queues.

The runtime's facade (`Tangram.exec`) calls it; so does every experiment that runs on the
runtime (`evaluation.runtime_sim`), so a simulated exec and a real one are the same action:
its demand parsed by `Demand.parse`, its payload an `ExecRequest`, its timeout the kill time,
and for an elastic range only what the shared history knows (`DurationProfiles.
learned_elasticity`: the fitted `AmdahlFit`, its priors before any run), never a true table.
"""

from __future__ import annotations

import uuid
from typing import Any

from managers.cpu.request import DEFAULT_OUTPUT_CAP, Command, ExecRequest
from tangram.actions import Action
from tangram.profiles import DurationProfiles, exec_kind
from tangram.resources import Demand
from tangram.validation import boolean


def exec_action(
    resource: str,
    env_id: str,
    trajectory: str,
    command: Command | list[str],
    cpu: Any,
    *,
    elastic: bool,
    timeout: float,
    output_cap: int | None,
    kind: str | None,
    profiles: DurationProfiles,
    now: float,
) -> Action:
    """The action of one command in environment `env_id` of `trajectory`, submitted at `now`.
    `kind`: the trusted caller's name for what it is (shared estimates), else the
    trajectory's own (`profiles.exec_kind`)."""
    boolean("elastic", elastic)
    demand = Demand.parse(cpu, "cpu")
    req = ExecRequest(
        env_id,
        command if isinstance(command, str) else tuple(command),
        timeout,
        elastic,
        DEFAULT_OUTPUT_CAP if output_cap is None else output_cap,
    )
    key = exec_kind(trajectory, command, kind)
    elasticity = None
    if elastic and not demand.is_fixed:  # what the history knows, as in the simulator
        elasticity = profiles.learned_elasticity(key, resource)
    return Action(
        f"x-{uuid.uuid4().hex[:12]}",
        {resource: demand},
        elasticity=elasticity,
        trajectory=trajectory,
        kind=key,
        payload=req,
        submit_time=now,
        timeout=timeout,
    )
