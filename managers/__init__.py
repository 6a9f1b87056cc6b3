"""Resource managers: basic/API (5.1), CPU allocate-on-execution (5.2), GPU evict-on-execution
(5.3); each with pure pool logic and real and simulated executor backends."""

from managers.base import EnvironmentManager, Manager

__all__ = ["EnvironmentManager", "Manager"]
