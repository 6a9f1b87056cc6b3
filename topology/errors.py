"""Errors of the topology layer.

`topology` sits below `tangram` in the dependency order, so it cannot raise
`tangram.TangramError` itself; the runtime maps these onto that hierarchy.
"""


class TopologyError(Exception):
    """A request the topology cannot satisfy (no free chunk, core already in use, ...)."""


class InvariantViolation(AssertionError):
    """A topology's internal state is inconsistent. Never expected; stops the program loudly."""
