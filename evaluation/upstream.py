"""The simulated rate-limited API server: it answers 429 to every call that arrives while
`limit` calls (of anyone: Tangram, a baseline's clients) are already in flight, so a count of 0
for Tangram is measured at the server, not assumed.

It is an executor of the closed-loop simulator for each `api:*` resource: `begin` sees every
call that any policy starts. (A refused call is counted, waits the `Retry-After` it was given
and is then served by its retry; a policy that never exceeds the limit sees none.) A client
that checks the limit itself (the `api-retry` baseline's attempts, refused before they run)
reports each refused attempt with `refuse`, so the server's count covers every system.
`listeners` hear each answer: a 429 when the call starts (with the server's in-flight count and
its `Retry-After`), a served call when it ends; Tangram's flow control learns from them
(`evaluation.flowcontrol`). The limit is the API's documented rate as a concurrency (Little's
law, `SearchParams.slots`), the same number Tangram's API pool is configured with by default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tangram.allocation import Assignment

# (resource, refused, in flight at the server before it, retry_after_s, now)
Listener = Callable[[str, bool, int, float, float], None]


@dataclass
class ApiUpstream:
    limits: Mapping[str, int]
    retry_after_s: float = 1.0  # what a 429 answer's Retry-After says (one rate period)
    in_flight: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    listeners: list[Listener] = field(default_factory=list)
    refused_at: list[float] = field(default_factory=list)

    def begin(self, assignment: Assignment, now: float) -> tuple[float, bool | None]:
        extra = 0.0
        for r in assignment.units:
            if r in self.limits:
                n = self.in_flight.get(r, 0)
                self.in_flight[r] = n + 1
                if n >= self.limits[r]:
                    self.rejections[r] = self.rejections.get(r, 0) + 1
                    self.refused_at.append(now)
                    extra = self.retry_after_s
                    for hear in self.listeners:
                        hear(r, True, n, self.retry_after_s, now)
        return extra, None

    def refuse(self, resource: str, now: float) -> None:
        """An attempt the server answered 429 without serving it (the client retries)."""
        self.rejections[resource] = self.rejections.get(resource, 0) + 1
        self.refused_at.append(now)

    def end(self, assignment: Assignment, now: float) -> None:
        for r in assignment.units:
            if r in self.limits:
                self.in_flight[r] -= 1
                for hear in self.listeners:
                    hear(r, False, self.in_flight[r], self.retry_after_s, now)

    @property
    def total(self) -> int:
        return sum(self.rejections.values())
