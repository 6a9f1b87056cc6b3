"""SandboxFusion's `POST /run_code` on Tangram: every SandboxFusion client switches by its URL.

verl's code rewards and tools, SkyRL's code interpreter and other clients POST
`{code, language, compile_timeout, run_timeout, memory_limit_MB, stdin, files, fetch_files}`
to a SandboxFusion server and read `{status, message, compile_result, run_result, files}`.
Here one such request is Tangram work in one environment: a fresh one (opened for the request,
closed after it, whatever happens) or, with the extension field `env_id`, an environment the
caller opened (multi-turn tools: files persist between calls). Each step is one action:

    compile  (compiled languages)  1 core, `compile_timeout`
    run                            the request's `cpu` demand (default 1), `run_timeout`;
                                   `elastic` (default: pytest with more than one allowed amount)
                                   gives a pytest run its granted cores as workers
    fetch    (`fetch_files` only)  1 core: the files come back as base64

Inputs (`files`, the code, `stdin`) go in through the environments' files API where the CPU
manager is local, else inside the first step's argv as base64, so the same request works on
every CPU backend (local, Docker, a Ray node elsewhere; `work`). SandboxFusion's semantics:
`status` is `Success` when every step finished with return code 0, `Failed` when one timed out
or returned non-zero (the run is skipped after a failed compile), `SandboxError` when a step
could not run (`message` says why); a language SandboxFusion knows but this server cannot run
(no toolchain) is a `SandboxError`, a language SandboxFusion does not know is a 422, as in
SandboxFusion. The response also carries `tangram` (an extension clients ignore): each step's
grant.

Also served: `/run_jupyter` (`jupyter`), and, for SandboxFusion's SDK, which appends each
function's path to its endpoint and sends no auth header, `POST /?token=T&_=/run_code` (the
endpoint `http://host:port/?token=T&_=`); its dataset endpoints answer a JSON 404 saying they
are not served. A fresh request takes a never-used sandbox from a warm pool (`warm`); the
runners' command lines are SandboxFusion's (`runners`). See docs/sandboxfusion.md for every
difference kept on purpose.

Modules: `models` (the request and response shapes, and how results map onto them), `work`
(the steps of one request), `routes` (the HTTP routes), `runners`, `jupyter`, `warm`.
"""

from tangram.runtime.sandboxfusion.models import (
    ARG_CHUNK,
    DEFAULT_MEMORY_MB,
    FIELDS,
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterResponse,
    RunStatus,
    command_result,
    overall,
)
from tangram.runtime.sandboxfusion.routes import UNSERVED, router, unserved
from tangram.runtime.sandboxfusion.work import fetched, run_code, run_jupyter, staged

__all__ = [
    "ARG_CHUNK",
    "DEFAULT_MEMORY_MB",
    "FIELDS",
    "UNSERVED",
    "CommandRunResult",
    "CommandRunStatus",
    "RunCodeRequest",
    "RunCodeResponse",
    "RunJupyterResponse",
    "RunStatus",
    "command_result",
    "fetched",
    "overall",
    "router",
    "run_code",
    "run_jupyter",
    "staged",
    "unserved",
]
