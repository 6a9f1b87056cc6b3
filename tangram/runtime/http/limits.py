"""Every bound on what one request may carry, for the native API (`/v1/...`) and
SandboxFusion's endpoints (`/run_code`, `/run_jupyter`) alike, as constants and as the
pydantic field types that enforce them. A bound named here holds on every endpoint that takes
the field."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tangram.resources import MAX_AMOUNT

MAX_BODY = 1 << 20  # bytes of one request body
BODY_TIMEOUT_S = 30.0  # s for a whole request body, from the app's first read, else 408
DRAIN_BODY = 16 << 20  # bytes of an over-limit body read and dropped before the 413
# after the 413 the server goes on reading and dropping the body (a lingering close, as
# nginx's): until it ends, LINGER_BODY bytes of it in all or LINGER_S s, then it closes
LINGER_BODY = 64 << 20  # bytes of an over-limit body read in all, before and after the 413
LINGER_S = 5.0  # s the server reads on after the 413, at most
MAX_COMMAND = 1 << 16  # characters of one command (or of one argv element)
MAX_OUTPUT_CAP = 16 << 20  # bytes of a command's stdout (and of its stderr) kept, at most
MAX_ARGV = 4096  # elements of an argv command
MAX_CODE = 1 << 20  # characters of one program or notebook cell (SandboxFusion's `code`)
MAX_TIMEOUT = 24 * 3600.0  # s, an exec's (or a run's, a cell's) timeout
MAX_UNITS = MAX_AMOUNT  # one demand amount
MAX_CHOICES = 1024  # amounts in a list demand
MAX_ITEMS = 1024  # files, paths or arguments in one request
MAX_NAME = 256  # characters of a trajectory, env, service or API name
MAX_PATH = 4096  # characters of a file path in an environment
MAX_FORK = 256  # environments one fork makes
MAX_MEMORY_MB = 1 << 24  # an environment's memory or disk bound

Units = Annotated[int, Field(ge=1, le=MAX_UNITS)]
Name = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME, pattern=r"^[^\x00-\x1f\x7f]+$")
]  # no control characters (logs)
FilePath = Annotated[str, Field(min_length=1, max_length=MAX_PATH)]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)]
MemoryMb = Annotated[int, Field(ge=1, le=MAX_MEMORY_MB)]
Choices = Annotated[list[Units], Field(min_length=1, max_length=MAX_CHOICES)]
