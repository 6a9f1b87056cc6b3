"""A minimal no-sandbox `/run_code` server: the reference `tangram bench sandboxfusion --latency`
measures Tangram against (what SandboxFusion does with `isolation: none`, in a few lines).

Per request: a temporary folder, the files and the code written there, the compile and run
commands of the language run by `/bin/bash` with a timeout (Python, C++ as SandboxFusion runs
them), the process group killed at the end; no scheduler, no sandbox, no memory limit. Run it
as `python -m evaluation.benches.sf_minimal --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import tempfile
import time
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

COMMANDS = {
    "python": ("main.py", None, "python3 main.py"),
    "cpp": ("main.cpp", "g++ -std=c++17 main.cpp -o test", "./test"),
}


class Request(BaseModel):
    code: str
    language: str
    compile_timeout: float = 10.0
    run_timeout: float = 10.0
    stdin: str | None = None
    files: dict[str, str | None] = {}


async def _run(command: str, cwd: str, timeout: float, stdin: str | None) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_shell(
        command,
        cwd=cwd,
        executable="/bin/bash",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    t = time.perf_counter()
    try:
        out, err = await asyncio.wait_for(proc.communicate((stdin or "").encode()), timeout)
    except TimeoutError:
        return {"status": "TimeLimitExceeded", "execution_time": time.perf_counter() - t}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {
        "status": "Finished",
        "execution_time": time.perf_counter() - t,
        "return_code": proc.returncode,
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
    }


def app() -> FastAPI:
    a = FastAPI()

    @a.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @a.post("/run_code")
    async def run_code(req: Request) -> dict[str, Any]:
        source, compile_cmd, run_cmd = COMMANDS[req.language]
        with tempfile.TemporaryDirectory(prefix="sf-minimal-") as d:
            for path, content in req.files.items():
                if content is not None:
                    with open(os.path.join(d, path), "wb") as f:
                        f.write(base64.b64decode(content))
            with open(os.path.join(d, source), "w") as f:
                f.write(req.code)
            compiled = None
            if compile_cmd is not None:
                compiled = await _run(compile_cmd, d, req.compile_timeout, None)
            ran = None
            if compiled is None or compiled.get("return_code") == 0:
                ran = await _run(run_cmd, d, req.run_timeout, req.stdin)
        steps = [s for s in (compiled, ran) if s is not None]
        ok = all(s["status"] == "Finished" and s["return_code"] == 0 for s in steps)
        return {
            "status": "Success" if ok else "Failed",
            "message": "",
            "compile_result": compiled,
            "run_result": ran,
            "files": {},
        }

    return a


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    ns = p.parse_args()
    uvicorn.run(app(), host="127.0.0.1", port=ns.port, log_level="warning")


if __name__ == "__main__":
    main()
