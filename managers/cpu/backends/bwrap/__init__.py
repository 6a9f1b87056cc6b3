"""The `bwrap` backend: a bubblewrap sandbox per environment over the cgroup grant.

Its parts, one job each: `backend` (the backend and each environment's `BwrapSandbox`),
`layout` (what a sandbox sees: the paths inside, the host's files bound in, the uid drop, the
holder's record), `start` (the trial sandbox, the holder's and the device sandbox's arguments),
`holder` (the descriptors a holder is entered through), `spawner` with `spawner_inside` and
`spawner_native` (the resident process that starts commands inside), `reset` (a used sandbox
back to a never-used one), `views` (the filesystems that keep host paths out of `/proc`),
`toolkit` (the host programs an image environment is started with)."""

from managers.cpu.backends.bwrap.backend import BwrapBackend, BwrapSandbox

__all__ = ["BwrapBackend", "BwrapSandbox"]
