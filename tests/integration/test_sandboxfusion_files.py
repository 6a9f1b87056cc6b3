"""`/run_code`'s `files` and `fetch_files` on the bwrap backend: the work directory's through the
environments' files API (no process per file), absolute paths elsewhere in the sandbox's own
root through the step itself; both come back byte for byte, owned by the sandbox's user."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from tangram.runtime.facade import Tangram
from tangram.runtime.sandboxfusion import RunCodeRequest, run_code

pytestmark = [pytest.mark.cgroup]
WHY = BwrapBackend.probe()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    if WHY is not None:
        pytest.skip(f"bwrap backend unavailable: {WHY}")
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def tg(loop) -> Iterator[tuple[Tangram, list]]:
    """A Tangram on bwrap whose `exec` records each step's argv."""
    t = Tangram(cpu=CpuManager(BwrapBackend()))
    loop.run_until_complete(t.start())
    argvs: list = []
    real = t.exec

    async def exec_(env, command, *a, **k):
        argvs.append(command)
        return await real(env, command, *a, **k)

    t.exec = exec_  # type: ignore[method-assign]
    yield t, argvs
    loop.run_until_complete(t.shutdown())


def test_work_directory_files_go_through_the_files_api_and_the_rest_through_the_step(loop, tg):
    t, argvs = tg
    argvs.clear()
    marker_rel, marker_abs, marker_tmp = b"rel-7f3a", b"abs-91c2", b"tmp-55e0"
    code = (
        "cat in/a.txt /sandbox/b.txt /tmp/c.txt; echo more >> in/a.txt; "
        "mkdir -p /tmp/o && printf T > /tmp/o/t.txt; printf R > out.txt; "
        "printf S > /sandbox/s.txt"
    )
    req = RunCodeRequest(
        code=code,
        language="bash",
        files={
            "in/a.txt": b64(marker_rel),
            "/sandbox/b.txt": b64(marker_abs),
            "/tmp/c.txt": b64(marker_tmp),
        },
        fetch_files=["in/a.txt", "out.txt", "/sandbox/s.txt", "/tmp/o/t.txt", "/tmp/none", "none"],
    )
    resp = loop.run_until_complete(run_code(t, req))
    assert resp.status == "Success", resp
    assert resp.run_result.stdout == (marker_rel + marker_abs + marker_tmp).decode()
    got = {p: base64.b64decode(v) for p, v in resp.files.items()}
    assert got == {
        "in/a.txt": marker_rel + b"more\n",
        "out.txt": b"R",
        "/sandbox/s.txt": b"S",
        "/tmp/o/t.txt": b"T",
    }  # missing ones left out, as SandboxFusion does
    staged = " ".join(" ".join(a) if isinstance(a, list) else a for a in argvs)
    assert b64(marker_tmp) in staged  # /tmp is the sandbox's own: written by the step
    assert b64(marker_rel) not in staged and b64(marker_abs) not in staged  # the files API
    fetch_steps = [a for a in argvs if isinstance(a, list) and "tangram-fetch" in a]
    assert (
        len(fetch_steps) == 1
        and "/tmp/o/t.txt" in fetch_steps[0]
        and "out.txt" not in fetch_steps[0]
    )


names = st.text(
    st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")), min_size=1, max_size=8
)


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.dictionaries(
        st.lists(names, min_size=1, max_size=3).map("/".join),
        st.binary(max_size=3000),
        min_size=1,
        max_size=4,
    ),
    stdin=st.none() | st.text(max_size=200),
)
def test_inputs_come_back_byte_for_byte(loop, tg, files, stdin):
    t, _ = tg
    # a path that is another's folder cannot be both: keep the leaves only
    files = {p: d for p, d in files.items() if not any(q.startswith(p + "/") for q in files)}
    req = RunCodeRequest(
        code="import sys; sys.stdout.write(sys.stdin.read())",
        language="python",
        stdin=stdin,
        files={p: b64(d) for p, d in files.items()},
        fetch_files=list(files),
    )
    resp = loop.run_until_complete(run_code(t, req))
    assert resp.status == "Success", resp
    assert resp.run_result.stdout == (stdin or "")
    assert {p: base64.b64decode(v) for p, v in resp.files.items()} == files
