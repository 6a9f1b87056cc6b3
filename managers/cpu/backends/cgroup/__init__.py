"""The `cgroup` backend (`backend`: one cgroup per environment, cpuset and quota rewritten per
exec) and the cgroup filesystem it writes (`fs`: both hierarchies, v1 and v2, the sweep of what
a dead server left). The `bwrap` and `docker` backends confine their commands with `fs` too."""

from managers.cpu.backends.cgroup.backend import CgroupBackend, CgroupSandbox

__all__ = ["CgroupBackend", "CgroupSandbox"]
