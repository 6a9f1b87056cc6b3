"""The bwrap backend's fast path (a resident spawner per sandbox) against its reference path
(nsenter + setpriv per exec), on real sandboxes: the same answers, the same confinement, and a
command that attacks its spawner harms only its own sandbox, which comes back."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap import spawner
from managers.cpu.backends.bwrap import spawner_native as native
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.environments import EnvState
from managers.cpu.request import ExecRequest

pytestmark = [pytest.mark.cgroup]
WHY = BwrapBackend.probe()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    if WHY is not None:
        pytest.skip(f"bwrap backend unavailable: {WHY}")
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def pair(loop) -> Iterator[tuple[tuple[CpuManager, str], tuple[CpuManager, str]]]:
    """(fast manager, its env), (reference manager, its env)."""
    fast = CpuManager(BwrapBackend(spawner=True))
    ref = CpuManager(BwrapBackend(spawner=False))
    for m in (fast, ref):
        loop.run_until_complete(m.start())
    envs = [loop.run_until_complete(m.open_env("spawner-test", 128)) for m in (fast, ref)]
    yield (fast, envs[0]), (ref, envs[1])
    for m in (fast, ref):
        loop.run_until_complete(m.close())


def execute(loop, m: CpuManager, env: str, command, timeout: float = 20.0):
    return loop.run_until_complete(m.execute(ExecRequest(env, command, timeout)))


texts = st.text(
    st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="'\\"), max_size=40
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(out=texts, err=texts, code=st.integers(0, 255), as_argv=st.booleans())
def test_fast_and_reference_paths_agree(loop, pair, out, err, code, as_argv):
    script = f"printf '%s' '{out}'; printf '%s' '{err}' >&2; cd /sandbox && pwd >&2; exit {code}"
    command = ("sh", "-c", script) if as_argv else script
    (fast, fenv), (ref, renv) = pair
    a, b = execute(loop, fast, fenv, command), execute(loop, ref, renv, command)
    assert (a.status, a.exit_code, a.stdout, a.stderr) == (
        b.status,
        b.exit_code,
        b.stdout,
        b.stderr,
    )
    assert a.exit_code == code and a.stdout == out and a.stderr == err + "/sandbox\n"


def test_a_command_runs_confined_to_its_grant_as_the_sandbox_user(loop, pair):
    (fast, env), _ = pair
    r = execute(
        loop,
        fast,
        env,
        "grep -E 'Cpus_allowed_list|NoNewPrivs|CapEff|CapBnd' "
        "/proc/self/status; id -u; cat /proc/self/cgroup | wc -l",
    )
    lines = dict(line.split(":\t") for line in r.stdout.splitlines() if ":\t" in line)
    node = fast.envs.get(env).node
    granted = min(fast.pool.cpu_node(node).domain_of)  # `execute` takes the first free core
    assert (
        lines["NoNewPrivs"] == "1"
        and int(lines["CapEff"], 16) == 0
        and int(lines["CapBnd"], 16) == 0
    )
    assert lines["Cpus_allowed_list"] == str(granted), r.stdout
    assert int(r.stdout.splitlines()[-2]) >= 1000  # not root


def test_the_spawner_cannot_be_read_and_its_death_harms_only_its_own_sandbox(loop, pair):
    (fast, env), _ = pair
    peek = execute(
        loop,
        fast,
        env,
        "for p in /proc/[0-9]*; do [ $p = /proc/$$ ] && continue; "
        "if grep -q 'tangram_spawne[r]' $p/cmdline 2>/dev/null; then echo FOUND; "
        "ls $p/fd >/dev/null 2>&1 && echo READABLE; "
        "cat $p/environ >/dev/null 2>&1 && echo READABLE; fi; done",
    )
    # the spawner and bwrap's init (its command line names the spawner too)
    assert peek.stdout.count("FOUND") >= 1 and "READABLE" not in peek.stdout, peek
    execute(loop, fast, env, "echo kept > /sandbox/kept")
    killer = execute(loop, fast, env, "kill -9 -1; sleep 2; echo after")
    assert killer.status == "error" and "spawner died" in killer.detail, killer
    again = execute(loop, fast, env, "cat /sandbox/kept")  # restarted, same work directory
    assert again.status == "ok" and again.stdout == "kept\n", again
    assert fast.envs.record(env).state is not EnvState.BROKEN


def test_commands_inherit_the_sandbox_filter_with_no_loader_per_exec(loop, pair):
    """The fast path runs no seccomp loader: the command is the spawner's direct child and
    carries the filter bwrap loaded for the spawner (one filter, not two)."""
    (fast, env), _ = pair
    r = execute(
        loop,
        fast,
        env,
        "grep -E '^Seccomp(_filters)?:' /proc/self/status; "
        "grep -c tangram_spawne[r] /proc/$PPID/cmdline; "
        "unshare -U true 2>/dev/null; echo unshare=$?",
    )
    lines = r.stdout.splitlines()
    assert "Seccomp:\t2" in lines and "Seccomp_filters:\t1" in lines, r.stdout
    assert "unshare=1" in lines, r.stdout  # the filter refuses new namespaces


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cap=st.integers(1, 70_000), extra=st.integers(1, 3_000_000))
def test_output_past_the_cap_is_drained_inside_and_the_command_runs_on(loop, pair, cap, extra):
    """Past the cap the spawner drops the rest in the sandbox: the command is not killed by a
    closed pipe and ends normally; exactly `cap` bytes come back, flagged truncated."""
    (fast, env), _ = pair
    script = (
        f"head -c {cap + extra} /dev/zero | tr '\\0' a; echo $? > /sandbox/finished; "
        f"head -c {cap + extra} /dev/zero >&2; echo $? >> /sandbox/finished"
    )
    r = loop.run_until_complete(fast.execute(ExecRequest(env, script, 30, output_cap=cap)))
    assert r.status == "ok" and r.exit_code == 0, r.detail
    assert r.truncated and r.stdout == "a" * cap and len(r.stderr) == cap
    done = execute(loop, fast, env, "cat /sandbox/finished; rm /sandbox/finished")
    assert done.stdout == "0\n0\n"  # both writers ran to their end: no SIGPIPE (141)


def parent_cmdline(loop, m: CpuManager, env: str) -> str:
    r = execute(loop, m, env, "tr '\\0' ' ' < /proc/$PPID/cmdline")
    assert r.status == "ok", r
    return r.stdout


def test_the_native_spawner_runs_where_a_compiler_builds_it(loop, pair):
    (fast, env), _ = pair
    line = parent_cmdline(loop, fast, env)
    if shutil.which("cc") or shutil.which("gcc"):
        assert line.startswith("/opt/tangram/tangram_spawner "), line
    else:
        assert "tangram_spawner.py" in line, line


def test_a_missing_program_is_named_on_the_spawner_line_callers_match(loop, pair):
    """`spawner.NOT_FOUND` (what `/run_code` maps to a missing toolchain for a step started
    without a shell) is what the spawner says; an environment without one says it has none."""
    (fast, env), (ref, renv) = pair
    r = execute(loop, fast, env, ("no-such-program-here", "x"))
    m = spawner.NOT_FOUND.fullmatch(r.stderr.strip())
    assert r.exit_code == 127 and m is not None and m.group(1) == "no-such-program-here", r
    assert fast.sandbox(env).spawned and not ref.sandbox(renv).spawned


def test_without_a_compiler_the_python_spawner_serves_the_same(loop, monkeypatch):
    monkeypatch.setattr(native, "build", lambda folder: False)
    m = CpuManager(BwrapBackend(spawner=True))
    loop.run_until_complete(m.start())
    try:
        env = loop.run_until_complete(m.open_env("spawner-py", 128))
        assert "tangram_spawner.py" in parent_cmdline(loop, m, env)
        r = execute(loop, m, env, "echo out; echo err >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
        missing = execute(loop, m, env, ("no-such-program-here",))
        assert missing.exit_code == 127 and "no-such-program-here" in missing.stderr
        assert spawner.NOT_FOUND.fullmatch(missing.stderr.strip()), missing.stderr
        assert m.sandbox(env).spawned
        big = loop.run_until_complete(
            m.execute(
                ExecRequest(
                    env,
                    "head -c 2000000 /dev/zero | tr '\\0' b; echo rc=$? >&2",
                    30,
                    output_cap=1000,
                )
            )
        )
        assert (
            big.exit_code == 0
            and big.truncated
            and big.stdout == "b" * 1000
            and big.stderr == "rc=0\n"
        ), big.detail  # drained: no SIGPIPE (rc=141)
    finally:
        loop.run_until_complete(m.close())
