"""The simulated rate-limited API server: it answers 429 to every call that arrives while
`limit` calls (of anyone: Tangram, a baseline's clients) are already in flight, so a count of 0
for Tangram is measured at the server, not assumed.

It is an executor of the closed-loop simulator for each `api:*` resource: `begin` sees every
call that any policy starts. (A refused call is counted and, in this model, still served; a
policy that never exceeds the limit sees none.) The limit is the API's documented rate as a
concurrency (Little's law, `SearchParams.slots`), the same number Tangram's API pool is
configured with by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tangram.allocation import Assignment


@dataclass
class ApiUpstream:
    limits: Mapping[str, int]
    in_flight: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)

    def begin(self, assignment: Assignment, now: float) -> tuple[float, bool | None]:
        for r in assignment.units:
            if r in self.limits:
                n = self.in_flight.get(r, 0)
                if n >= self.limits[r]:
                    self.rejections[r] = self.rejections.get(r, 0) + 1
                self.in_flight[r] = n + 1
        return 0.0, None

    def end(self, assignment: Assignment, now: float) -> None:
        for r in assignment.units:
            if r in self.limits:
                self.in_flight[r] -= 1

    @property
    def total(self) -> int:
        return sum(self.rejections.values())
