"""The SandboxFusion-shaped reference server of `tangram bench sandboxfusion --latency` answers
as SandboxFusion does (its figures are only a reference if it does the same work)."""

from __future__ import annotations

import base64

from fastapi.testclient import TestClient

from evaluation.benches import sf_shaped


def test_it_runs_the_code_with_files_stdin_and_fetches_back():
    with TestClient(sf_shaped.app()) as c:
        d = c.post(
            "/run_code",
            json={
                "code": "import sys; print(sys.stdin.read().upper()); open('out.txt', 'w').write("
                "open('in/a.txt').read()[::-1])",
                "language": "python",
                "stdin": "abc",
                "files": {"in/a.txt": base64.b64encode(b"xyz").decode(), "skip": None},
                "fetch_files": ["out.txt", "missing"],
            },
        ).json()
    assert d["status"] == "Success" and d["run_result"]["stdout"] == "ABC\n"
    assert d["run_result"]["return_code"] == 0 and d["compile_result"] is None
    assert {k: base64.b64decode(v) for k, v in d["files"].items()} == {"out.txt": b"zyx"}


def test_a_timeout_and_a_failure_are_sandboxfusions_statuses():
    with TestClient(sf_shaped.app()) as c:
        slow = c.post(
            "/run_code",
            json={"code": "import time; time.sleep(5)", "language": "python", "run_timeout": 0.3},
        ).json()
        bad = c.post("/run_code", json={"code": "raise SystemExit(3)", "language": "python"}).json()
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    assert bad["status"] == "Failed" and bad["run_result"]["return_code"] == 3
