"""The GPU action builder: an `invoke` of a registered service turned into its `Action`.

The demand is the service's DoP variants within what the caller allows; with more than one
variant and an inference time for each, the action is elastic over them (its efficiency
table from the registry's measured times: a property of the service, not of one run). A
service with no inference profile is estimated as an elastic exec is: what the shared
history knows of its kind (`DurationProfiles.learned_elasticity`), the rule the simulator
applies to every action it hands the scheduler (`DurationProfiles.as_seen`).
"""

from __future__ import annotations

import uuid
from typing import Any

from managers.gpu.services import ServiceRegistry
from tangram.actions import Action, Elasticity
from tangram.errors import NotFound, ValidationError
from tangram.profiles import DurationProfiles
from tangram.resources import Demand


def invoke_action(
    registry: ServiceRegistry,
    resource: str,
    service: str,
    payload: Any,
    gpus: Any,
    now: float,
    *,
    profiles: DurationProfiles,
    kind: str | None = None,
) -> Action:
    """The action of one call of `service` on `gpus` (an amount, a choice or a (lo, hi)
    range of its variants), submitted at `now`. `kind`: the trusted caller's name for what
    it is (the estimates it shares), else `invoke:<service>`."""
    if not isinstance(service, str) or service not in registry:
        raise NotFound("service", service, f"unknown service (registered: {registry.names()})")
    svc = registry.get(service)
    if isinstance(gpus, tuple) and len(gpus) == 2:
        rng = Demand.parse(gpus, "gpus")
        amounts = [k for k in svc.dops if rng.min <= k <= rng.max]
    else:
        amounts = list(Demand.parse(gpus, "gpus").amounts)
        if any(k not in svc.dops for k in amounts):
            amounts = []
    if not amounts:
        raise ValidationError("gpus", gpus, f"{service} has variants of {svc.dops} GPUs")
    demand = Demand.choices(amounts)
    elasticity = None
    duration = svc.infer_s.get(demand.min)
    if not demand.is_fixed and all(k in svc.infer_s for k in amounts):
        base = demand.min * svc.infer_s[demand.min]
        table = {k: min(1.0, base / (k * svc.infer_s[k])) for k in amounts}
        elasticity = Elasticity(resource, base, table)
        duration = None
    key = kind if kind is not None else f"invoke:{service}"
    if elasticity is None and duration is None and not demand.is_fixed:
        elasticity = profiles.learned_elasticity(key, resource)
    return Action(
        f"g-{uuid.uuid4().hex[:12]}",
        {resource: demand},
        elasticity=elasticity,
        duration=duration,
        kind=key,
        service=service,
        payload=payload,
        submit_time=now,
    )
