"""The typed client of a node agent (`RemoteAgent`) has exactly the agent's methods, with the
same parameters, so the central managers never call an agent method by name (no Ray needed)."""

from __future__ import annotations

import inspect

from tangram.runtime.ray.agent import NodeAgent
from tangram.runtime.ray.remote import RemoteAgent


def _methods(cls: type) -> dict[str, list[str]]:
    """Public methods and their parameters (less the tracing one `ray.remote` adds to a class
    it has made an actor, in a process where that happened)."""
    return {
        n: [p for p in inspect.signature(f).parameters if p != "_ray_trace_ctx"]
        for n, f in vars(cls).items()
        if inspect.isfunction(f) and not n.startswith("_")
    }


def test_the_remote_agent_mirrors_the_node_agent():
    agent, remote = _methods(NodeAgent), _methods(RemoteAgent)
    assert set(agent) == set(remote) - {"kill"}  # `kill`: Ray's, not the agent's
    for name, params in agent.items():
        assert params == remote[name], name
        assert inspect.iscoroutinefunction(getattr(RemoteAgent, name)), name
