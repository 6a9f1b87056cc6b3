"""The CPU action builder: an `exec` call turned into the `Action` the scheduler queues.

The runtime's facade (`Tangram.exec`) calls it; so does every experiment that runs on the
runtime (`evaluation.runtime_sim`), so a simulated exec and a real one are the same action:
its demand parsed by `Demand.parse`, its payload an `ExecRequest`, its timeout the kill time,
and for an elastic range only what the shared history knows (`DurationProfiles.
learned_elasticity`: the fitted `AmdahlFit`, its priors before any run), never a true table.

A *vector* exec (`gpus` given) demands the CPU pool's cores and one aligned chunk of the GPU
pool `gpu_resource` together: one action, placed atomically by the scheduler, run by the CPU
manager with the chunk's devices (`ExecRequest.gpu_resource`, `request.gpu_grant`).
"""

from __future__ import annotations

import uuid
from typing import Any

from managers.cpu.request import DEFAULT_OUTPUT_CAP, Command, ExecRequest
from tangram.actions import Action
from tangram.errors import ValidationError
from tangram.profiles import DurationProfiles, exec_kind
from tangram.resources import Demand
from tangram.validation import boolean
from topology import is_pow2


def gpu_demand(gpus: Any) -> Demand:
    """`gpus` as `invoke` takes it (an amount, a list of amounts, a (lo, hi) range) for one
    aligned chunk: the powers of two it allows; a `ValidationError` naming `gpus` when none."""
    if isinstance(gpus, tuple) and len(gpus) == 2:
        rng = Demand.parse(gpus, "gpus")
        amounts = [k for k in rng.amounts if is_pow2(k)]
    else:
        amounts = list(Demand.parse(gpus, "gpus").amounts)
        if not all(is_pow2(k) for k in amounts):
            amounts = []
    if not amounts:
        raise ValidationError(
            "gpus", gpus, "must allow a power of two (a command of k GPUs takes one aligned chunk)"
        )
    return Demand.choices(amounts)


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
    gpus: Any = None,
    gpu_resource: str | None = None,
    gpu_node: str | None = None,
    session: str | None = None,
    interactive: bool = False,
    expect: Any = (),
) -> Action:
    """The action of one command in environment `env_id` of `trajectory`, submitted at `now`.
    `kind`: the trusted caller's name for what it is (shared estimates), else the
    trajectory's own (`profiles.exec_kind`). `gpus` (None: no GPU): a chunk of the pool
    `gpu_resource` too, on its node `gpu_node` (the environment's machine). `session`: run it
    in that shell session of the environment (`interactive`: typed into the program holding
    its terminal, ended by one of the `expect` prompts)."""
    boolean("elastic", elastic)
    demand = Demand.parse(cpu, "cpu")
    demands = {resource: demand}
    if gpus is not None:
        if gpu_resource is None or gpu_node is None or gpu_resource == resource:
            raise ValidationError("gpus", gpus, "no GPU pool to take them from")
        demands[gpu_resource] = gpu_demand(gpus)
    else:
        gpu_resource = gpu_node = None
    req = _request(
        env_id,
        command,
        timeout,
        elastic,
        output_cap,
        (gpu_resource, gpu_node),
        (session, interactive, expect),
    )
    key = exec_kind(trajectory, command, kind)
    elasticity = None
    if elastic and not demand.is_fixed:  # what the history knows, as in the simulator
        elasticity = profiles.learned_elasticity(key, resource)
    return Action(
        f"x-{uuid.uuid4().hex[:12]}",
        demands,
        elasticity=elasticity,
        trajectory=trajectory,
        kind=key,
        payload=req,
        submit_time=now,
        timeout=timeout,
    )


def _request(
    env_id: str,
    command: Command | list[str],
    timeout: float,
    elastic: bool,
    output_cap: int | None,
    gpu: tuple[str | None, str | None],
    session: tuple[str | None, bool, Any],
) -> ExecRequest:
    """The action's payload: the command, and where it runs (a GPU chunk, a session)."""
    name, interactive, expect = session
    boolean("interactive", interactive)
    if isinstance(expect, str) or not isinstance(expect, list | tuple):
        raise ValidationError("expect", expect, "must be a list of strings")
    return ExecRequest(
        env_id,
        command if isinstance(command, str) else tuple(command),
        timeout,
        elastic,
        DEFAULT_OUTPUT_CAP if output_cap is None else output_cap,
        gpu[0],
        gpu[1],
        name,
        interactive,
        tuple(expect),
    )
