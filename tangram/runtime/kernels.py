"""Persistent kernels: an IPython kernel kept in an environment's sandbox, each cell one action.

A kernel is a shell session whose shell became the kernel's driver
(`managers/cpu/sessions/kernel.py`: an ipykernel started inside the sandbox, cells in and
answers out over the session's terminal), so it inherits what a session has: the command's
grant per cell, the background allowance between cells, a timeout that interrupts (the kernel
lives on), and a dead kernel that names itself. `Kernels` is the facade's part; its handle is
`"{env_id}/{name}"`.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tangram.errors import ValidationError
from tangram.results import Result, Status

if TYPE_CHECKING:
    from managers.base import EnvironmentManager

READY = "TANGRAM-KERNEL-READY"  # the driver's words (managers/cpu/sessions/kernel.py)
RESULT = "TANGRAM-KERNEL-RESULT "
END = " TANGRAM-KERNEL-END"
START_S = 90.0  # how long a kernel may take to start
LINE = 3000  # base64 characters a line (a terminal's line holds 4095)
CELL_CAP = 32 << 20  # bytes of one cell's answer (its outputs, images included)


@dataclass(frozen=True, slots=True)
class Cell:
    """What one cell did: `status` OK (it ran; an exception in it is `error`, as in a
    notebook), TIMEOUT (interrupted at its timeout; the kernel lives on) or FAILED (the kernel
    is gone: `detail` says how); its `stdout`, `stderr`, `display` (the mime bundle of each
    display_data and execute_result: `text/plain`, `image/png` as base64, ...) and `error`
    (each `{ename, evalue, traceback}`)."""

    status: Status
    stdout: str = ""
    stderr: str = ""
    display: list[dict[str, Any]] = field(default_factory=list)
    error: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "display": self.display,
            "error": self.error,
            "detail": self.detail,
        }


def split_handle(kernel: object) -> tuple[str, str]:
    if not isinstance(kernel, str) or kernel.count("/") != 1:
        raise ValidationError("kernel", kernel, "must be a kernel handle 'env_id/name'")
    env, name = kernel.split("/")
    return env, name


def cell_text(code: str) -> str:
    """The cell as its driver reads it: base64 lines, then an empty line."""
    raw = base64.b64encode(code.encode("utf-8", "surrogateescape")).decode()
    lines = [raw[i : i + LINE] for i in range(0, len(raw), LINE)] or [""]
    return "\n".join(lines) + "\n\n"


def cell_of(result: Result) -> Cell:
    """The `Cell` of a run of the driver (its answer line in the run's output)."""
    out = result.stdout
    at = out.rfind(RESULT)
    end = out.find(END, at) if at >= 0 else -1
    if at >= 0 and end < 0:  # the end marker ended the run: it is not in the output
        end = len(out.rstrip())
    if at < 0 or end < 0:
        why = result.detail if result.status is not Status.OK else "no answer from the kernel"
        return Cell(Status.FAILED, stdout=out[-4000:], detail=why)
    try:
        got = json.loads(out[at + len(RESULT) : end])
    except ValueError as exc:
        return Cell(Status.FAILED, detail=f"the kernel's answer does not parse ({exc})")
    timed_out = got.get("timed_out") or result.status is Status.TIMEOUT
    return Cell(
        Status.TIMEOUT if timed_out else Status.OK,
        stdout=got.get("stdout", ""),
        stderr=got.get("stderr", ""),
        display=list(got.get("display", [])),
        error=list(got.get("error", [])),
        detail=result.detail if timed_out else "",
    )


class Kernels:
    """`Tangram`'s kernel methods, over its session methods."""

    cpu: EnvironmentManager | None

    if TYPE_CHECKING:  # `Tangram`'s own (`tangram.runtime.sessions.Sessions`)

        async def open_session(self, env: str, name: str = "default") -> str: ...

        async def run(self, env: str, name: str, command: str, *a: Any, **kw: Any) -> Result: ...

        async def close_session(self, env: str, name: str) -> None: ...

        def _shells(self, env_id: str, name: object) -> Any: ...

    async def open_kernel(self, env: str) -> str:
        """Start an IPython kernel in environment `env`'s sandbox; returns its handle for
        `run_cell` and `close_kernel`."""
        name = f"kernel-{uuid.uuid4().hex[:8]}"
        command = await self._shells(env, name).kernel_command(env)
        await self.open_session(env, name)
        started = await self.run(
            env, name, command, timeout=START_S, interactive=True, expect=[READY]
        )
        if started.status is not Status.OK or READY not in started.detail:  # its prompt
            await self.close_session(env, name)
            raise ValidationError(
                "env_id",
                env,
                f"the kernel did not start: {started.detail}; {started.stdout[-2000:]}",
            )
        return f"{env}/{name}"

    async def run_cell(self, kernel: str, code: str, cpu: Any = 1, timeout: float = 60.0) -> Cell:
        """Execute one cell as one action (`cpu` cores for it alone); variables persist from
        cell to cell. Past `timeout` the cell is interrupted and the kernel lives on."""
        env, name = split_handle(kernel)
        if not isinstance(code, str):
            raise ValidationError("code", code, "must be a string")
        result = await self.run(
            env,
            name,
            cell_text(code),
            cpu,
            False,
            timeout,
            CELL_CAP,
            interactive=True,
            expect=[END],
            kind="cell",
        )
        return cell_of(result)

    async def close_kernel(self, kernel: str) -> None:
        env, name = split_handle(kernel)
        await self.close_session(env, name)
