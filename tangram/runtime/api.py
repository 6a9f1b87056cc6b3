"""`TangramApi`: the operations a user's code calls on Tangram, whichever side of the wire it is
on: the facade in this process (`tangram.runtime.facade.Tangram`) or the client of a
`tangram serve` server (`tangram.runtime.client.TangramClient`). Both implement it with the
same parameters (names, kinds and defaults: tests/unit/test_interfaces.py holds them to it),
so code written against one runs against the other (the verl adapter, `run_tests_reward`).

Each call raises what `Tangram` raises, over HTTP too: `ValidationError` naming a bad value
or an unknown environment, `Infeasible` for a demand no pool can ever meet, `QueueFull`,
`ShuttingDown`, else `TangramError`. Cancelling a call cancels its action while it is queued.
"""

from __future__ import annotations

from typing import Any, Protocol

from tangram.results import Result


class TangramApi(Protocol):
    async def open_env(
        self,
        trajectory: str,
        memory_mb: int = 1024,
        network: bool = False,
        *,
        image: str | None = None,
        disk_mb: int | None = None,
        snapshot: str | None = None,
    ) -> str:
        """The id of a new environment (a sandbox) for `trajectory`: `memory_mb` reserved for
        its life, no network unless `network`; its root filesystem an `image` (a private layer
        of at most `disk_mb` MiB over it), or the files of a `snapshot`."""

    async def exec(
        self,
        env: str,
        command: str | list[str],
        cpu: Any = 1,
        elastic: bool = False,
        timeout: float = 60.0,
        output_cap: int | None = None,
        kind: str | None = None,
        gpus: Any = None,
    ) -> Result:
        """Run `command` in environment `env` as one action: `cpu` cores (an amount, a set of
        amounts or a (lo, hi) range; `elastic`: the command learns its cores from its
        environment), killed after `timeout` seconds, its stdout and stderr kept up to
        `output_cap` bytes each (None: the CPU manager's default); `kind` the caller's name
        for it (keys the duration estimates); `gpus` (None: none) a GPU chunk of the
        environment's machine too, in the same action."""

    async def close_env(self, env_id: str) -> None:
        """Close the environment: its queued actions are cancelled, its sandbox removed."""

    async def open_session(self, env: str, name: str = "default") -> str:
        """Start shell session `name` in environment `env` (state persists across `run`)."""

    async def run(
        self,
        env: str,
        name: str,
        command: str,
        cpu: Any = 1,
        elastic: bool = False,
        timeout: float = 60.0,
        output_cap: int | None = None,
        *,
        interactive: bool = False,
        expect: list[str] | tuple[str, ...] = (),
        kind: str | None = None,
    ) -> Result:
        """Run one command in session `name` as one action (its `cpu` for it alone)."""

    async def close_session(self, env: str, name: str) -> None:
        """End session `name`: its shell and what it started are killed."""

    async def open_kernel(self, env: str) -> str:
        """Start an IPython kernel in `env`; returns its handle."""

    async def run_cell(self, kernel: str, code: str, cpu: Any = 1, timeout: float = 60.0) -> Any:
        """Execute one cell as one action; variables persist."""

    async def close_kernel(self, kernel: str) -> None:
        """End the kernel."""
