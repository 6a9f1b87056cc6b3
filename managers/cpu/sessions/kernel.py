"""The persistent kernel's driver: runs *inside* a sandbox, in a shell session, with the
server's Python (`$TANGRAM_PYTHON`, which has ipykernel and jupyter_client). Not imported by
the server: it is installed in the support folder beside the session host.

It starts one ipykernel (a child in the same sandbox and cgroup slot, over loopback TCP in the
sandbox's own network namespace), prints `READY`, then serves cells for as long as the session
lives: a cell arrives on its terminal as lines of base64 (under 4 KiB each: a terminal's line
limit) ended by an empty line; it is executed and answered with one line, `RESULT` + JSON
`{stdout, stderr, display: [mime bundle], error: [{ename, evalue, traceback}], timed_out}` +
`END`. Variables persist from cell to cell. On SIGINT (the session's timeout) the kernel is
interrupted, the cell's answer says `timed_out`, and the kernel lives on.
"""

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import time

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

READY = "TANGRAM-KERNEL-READY"
RESULT = "TANGRAM-KERNEL-RESULT "
END = " TANGRAM-KERNEL-END"
START_TIMEOUT_S = 60.0
INTERRUPT_GRACE_S = 5.0


class Interrupted(Exception):
    pass


def _on_sigint(signum, frame):
    raise Interrupted()


def start_kernel(folder):
    cf, _ = write_connection_file(
        fname=os.path.join(folder, "kernel.json"), transport="tcp", ip="127.0.0.1"
    )
    env = {
        **os.environ,
        "JUPYTER_PLATFORM_DIRS": "1",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    log = open(os.path.join(folder, "kernel.log"), "wb")
    kernel = subprocess.Popen(
        [sys.executable, "-m", "ipykernel_launcher", "-f", cf, "--HistoryManager.enabled=False"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # Ctrl-C at the terminal reaches the driver, not the kernel
    )
    client = BlockingKernelClient(connection_file=cf)
    client.load_connection_file()
    client.start_channels(hb=False)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if kernel.poll() is not None or time.monotonic() > deadline:
            kernel.kill()
            with open(os.path.join(folder, "kernel.log"), errors="replace") as f:
                sys.stdout.write(f"the kernel did not start:\n{f.read()[-4000:]}\n")
            raise SystemExit(1)
        client.kernel_info()
        try:
            reply = client.get_shell_msg(timeout=1.0)
        except queue.Empty:
            continue
        if reply.get("msg_type") == "kernel_info_reply":
            break
    while True:  # the start-up's status messages are no cell's
        try:
            client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
    return kernel, client


def collect(client, msg_id, cell):
    """Read the cell's messages into `cell` until its kernel is idle again."""
    while True:
        try:
            msg = client.get_iopub_msg(timeout=1.0)
        except queue.Empty:
            continue
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
            return


def run_cell(kernel, client, code):
    cell = {"stdout": "", "stderr": "", "display": [], "error": [], "timed_out": False}
    msg_id = client.execute(code, store_history=True, allow_stdin=False)
    try:
        collect(client, msg_id, cell)
    except Interrupted:
        cell["timed_out"] = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one interrupt is enough
        try:
            kernel.send_signal(signal.SIGINT)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while time.monotonic() < deadline:
                try:
                    msg = client.get_iopub_msg(timeout=0.2)
                except queue.Empty:
                    continue
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "error":
                    c = msg["content"]
                    cell["error"].append({k: c.get(k) for k in ("ename", "evalue", "traceback")})
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
        finally:
            signal.signal(signal.SIGINT, _on_sigint)
    return cell


def read_cell():
    """The next cell's code (base64 lines ended by an empty line); None at the end of input."""
    parts = []
    while True:
        line = sys.stdin.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            return base64.b64decode("".join(parts)).decode("utf-8", "surrogateescape")
        parts.append(line)


def main():
    folder = os.path.join("/tmp/.tangram-sessions", f"kernel-{os.getpid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    kernel, client = start_kernel(folder)
    signal.signal(signal.SIGINT, _on_sigint)
    print(READY, flush=True)
    try:
        while True:
            try:
                code = read_cell()
            except Interrupted:
                continue
            if code is None:
                return
            try:
                cell = run_cell(kernel, client, code)
            except Interrupted:
                cell = {"stdout": "", "stderr": "", "display": [], "error": [], "timed_out": True}
            if kernel.poll() is not None:
                cell["error"].append(
                    {"ename": "KernelDied", "evalue": f"exit code {kernel.returncode}",
                     "traceback": []}
                )  # fmt: skip
            sys.stdout.write(RESULT + json.dumps(cell) + END + "\n")
            sys.stdout.flush()
            if kernel.poll() is not None:
                return
    finally:
        client.stop_channels()
        kernel.kill()
        kernel.wait()


if __name__ == "__main__":
    main()
