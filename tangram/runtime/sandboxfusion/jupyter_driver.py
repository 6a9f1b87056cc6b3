"""The `/run_jupyter` driver: runs *inside* the request's sandbox, with the server's Python.

Not imported by the server: `jupyter.py` writes this file into the sandbox's work directory with
the request (`.tangram-jupyter.json`: cells, cell_timeout, total_timeout) and runs it as one
exec. It starts one ipykernel of its own (a child process in the same sandbox, the same cgroup
grant), connected over loopback TCP (the sandbox's own network namespace), runs the cells
in order, and prints one line: `RESULT_MARK` + JSON `{"cells": [...], "timed_out": bool}`.

Per cell, as SandboxFusion returns it: `stdout` and `stderr` (the stream messages, joined),
`display` (the `data` mime bundle of each display_data and execute_result message: text as
`text/plain`, images base64 as `image/png`), `error` (each error as `{ename, evalue,
traceback}`). A cell past `cell_timeout` (0: none) or the whole run past `total_timeout`
stops the run: the kernel is interrupted and killed, the cells done so far are kept.
"""

import json
import os
import queue
import subprocess
import sys
import time

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

RESULT_MARK = "TANGRAM-JUPYTER-RESULT "
REQUEST = ".tangram-jupyter.json"
START_TIMEOUT_S = 60.0
KERNEL_LOG = ".tangram-kernel.log"


def start_kernel() -> tuple[subprocess.Popen, BlockingKernelClient]:
    # loopback: inside the sandbox's own network namespace, nothing else can reach it
    cf, _ = write_connection_file(
        fname=os.path.abspath(".tangram-kernel.json"), transport="tcp", ip="127.0.0.1"
    )
    env = {
        **os.environ,
        "JUPYTER_PLATFORM_DIRS": "1",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    log = open(KERNEL_LOG, "wb")  # the kernel's, for as long as it lives
    kernel = subprocess.Popen(
        [sys.executable, "-m", "ipykernel_launcher", "-f", cf, "--HistoryManager.enabled=False"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    client = BlockingKernelClient(connection_file=cf)
    client.load_connection_file()
    client.start_channels(hb=False)  # liveness: the kernel is our child, we watch it directly
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if kernel.poll() is not None or time.monotonic() > deadline:
            kernel.kill()
            with open(KERNEL_LOG, errors="replace") as f:
                sys.stderr.write(f"the kernel did not start:\n{f.read()[-4000:]}")
            raise SystemExit(1)
        client.kernel_info()
        try:
            reply = client.get_shell_msg(timeout=1.0)
        except queue.Empty:
            continue
        if reply.get("msg_type") == "kernel_info_reply":
            break
    while True:  # what the kernel said while starting (its status messages) is not a cell's
        try:
            client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
    return kernel, client


def run_cell(client: BlockingKernelClient, code: str, deadline: float) -> tuple[dict, bool]:
    """One cell's outputs and whether it ran past `deadline`."""
    cell = {"stdout": "", "stderr": "", "display": [], "error": []}
    msg_id = client.execute(code, store_history=False, allow_stdin=False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return cell, True
        try:
            msg = client.get_iopub_msg(timeout=left)
        except queue.Empty:
            return cell, True
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            cell["stdout" if content.get("name") == "stdout" else "stderr"] += content["text"]
        elif kind in ("display_data", "execute_result"):
            cell["display"].append(content.get("data", {}))
        elif kind == "error":
            cell["error"].append({k: content.get(k) for k in ("ename", "evalue", "traceback")})
        elif kind == "status" and content.get("execution_state") == "idle":
            return cell, False


def main() -> None:
    with open(REQUEST) as f:
        req = json.load(f)
    kernel, client = start_kernel()
    cells: list[dict] = []
    timed_out = False
    try:
        total = time.monotonic() + req["total_timeout"]
        for code in req["cells"]:
            per = req["cell_timeout"]
            deadline = min(total, time.monotonic() + per) if per > 0 else total
            cell, timed_out = run_cell(client, code, deadline)
            cells.append(cell)
            if timed_out:
                break
    finally:
        print(RESULT_MARK + json.dumps({"cells": cells, "timed_out": timed_out}), flush=True)
        client.stop_channels()
        kernel.kill()
        kernel.wait()


if __name__ == "__main__":
    main()
