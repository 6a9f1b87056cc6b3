"""A CPU node as a networkx tree (node -> NUMA domains -> cores) with free/used state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx

from topology.errors import InvariantViolation, TopologyError


class CpuNode:
    """Cores of one machine grouped by NUMA domain.

    `choose(k)` keeps an action inside one NUMA domain whenever one has room (best fit: the
    domain with the fewest free cores that still holds k, so large domains stay whole for
    large actions); otherwise it spans domains, largest free first.
    """

    def __init__(self, name: str, numa: Mapping[int, Sequence[int]]) -> None:
        if not numa or not any(numa.values()):
            raise TopologyError(f"CPU node {name!r} has no cores")
        self.name = name
        self.numa = {int(d): tuple(sorted(int(c) for c in cores)) for d, cores in numa.items()}
        self.domain_of = {c: d for d, cores in self.numa.items() for c in cores}
        if len(self.domain_of) != sum(len(c) for c in self.numa.values()):
            raise TopologyError(f"CPU node {name!r}: a core is listed in two NUMA domains")
        self.free: dict[int, set[int]] = {d: set(c) for d, c in self.numa.items()}
        self._graph: nx.DiGraph | None = None

    @classmethod
    def flat(cls, name: str, cores: int) -> CpuNode:
        return cls(name, {0: range(cores)})

    @property
    def graph(self) -> nx.DiGraph:
        if self._graph is None:
            g = nx.DiGraph()
            g.add_node(self.name, kind="node")
            for d, cores in self.numa.items():
                g.add_edge(self.name, ("numa", d))
                g.nodes[("numa", d)]["kind"] = "numa"
                for c in cores:
                    g.add_edge(("numa", d), ("core", c))
                    g.nodes[("core", c)]["kind"] = "core"
            self._graph = g
        return self._graph

    @property
    def capacity(self) -> int:
        return len(self.domain_of)

    def free_count(self) -> int:
        return sum(len(s) for s in self.free.values())

    def copy(self) -> CpuNode:
        n = CpuNode.__new__(CpuNode)
        n.name, n.numa, n.domain_of, n._graph = self.name, self.numa, self.domain_of, self._graph
        n.free = {d: set(s) for d, s in self.free.items()}
        return n

    def choose(self, k: int) -> tuple[int, ...]:
        """Pick k free cores (not yet taken); see the class docstring for the rule."""
        if k <= 0:
            raise TopologyError(f"{self.name}: a core request must be positive, got {k!r}")
        if k > self.free_count():
            raise TopologyError(f"{self.name}: {k} cores requested, {self.free_count()} free")
        fitting = [d for d, s in self.free.items() if len(s) >= k]
        if fitting:
            d = min(fitting, key=lambda d: (len(self.free[d]), d))
            return tuple(sorted(self.free[d])[:k])
        picked: list[int] = []
        for d in sorted(self.free, key=lambda d: (-len(self.free[d]), d)):
            picked.extend(sorted(self.free[d])[: k - len(picked)])
            if len(picked) == k:
                break
        return tuple(sorted(picked))

    def take(self, cores: Sequence[int]) -> None:
        for c in cores:
            d = self.domain_of.get(c)
            if d is None:
                raise TopologyError(f"{self.name}: core {c} does not exist")
            if c not in self.free[d]:
                raise TopologyError(f"{self.name}: core {c} is already in use")
        if len(set(cores)) != len(cores):
            raise TopologyError(f"{self.name}: duplicate cores in {tuple(cores)}")
        for c in cores:
            self.free[self.domain_of[c]].remove(c)

    def allocate(self, k: int) -> tuple[int, ...]:
        cores = self.choose(k)
        self.take(cores)
        return cores

    def release(self, cores: Sequence[int]) -> None:
        for c in cores:
            d = self.domain_of.get(c)
            if d is None or c in self.free[d]:
                raise InvariantViolation(f"{self.name}: core {c} released but not in use")
            self.free[d].add(c)
