"""The paper's workloads as parameterised generators (AI coding, DeepSearch, MOPD,
MOPD + Search). Every parameter names its source in its field metadata (`sources(params)`)."""

from evaluation.workloads.base import Step, Trajectory, Workload, sources
from evaluation.workloads.registry import available, get_workload

__all__ = ["Step", "Trajectory", "Workload", "available", "get_workload", "sources"]
