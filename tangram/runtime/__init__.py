"""The runtime layer: the `Tangram` facade on the wall clock, cluster building from YAML, the
HTTP server and client, metrics, the Ray node agent and managers, the CLI.

It sits above the core (`tangram.*`), `solvers` and `managers`, and below `evaluation`:
nothing under it is imported by a lower layer (see docs/architecture.md)."""

from tangram.runtime.client import TangramClient
from tangram.runtime.facade import Tangram, require_ok

__all__ = ["Tangram", "TangramClient", "require_ok"]
