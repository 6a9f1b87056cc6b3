"""The CPU manager, allocate-on-execution (paper 5.2): environments per trajectory, cores
granted right before each exec and taken back when it exits; bwrap (sandboxed), cgroup, docker,
affinity and sim backends."""

from managers.cpu.backends import Backend, EnvironmentBroken, NotStarted, create, started
from managers.cpu.environments import Environment, EnvironmentTable
from managers.cpu.manager import LOCAL, CpuManager
from managers.cpu.request import ExecRequest

__all__ = [
    "LOCAL",
    "Backend",
    "CpuManager",
    "Environment",
    "EnvironmentBroken",
    "EnvironmentTable",
    "ExecRequest",
    "NotStarted",
    "create",
    "started",
]
