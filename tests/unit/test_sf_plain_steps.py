"""`/run_code` steps started without a shell (`runners.plain_argv`): only commands a shell
would pass on word for word, and a program the spawner cannot find still answers as a missing
toolchain (`missing_toolchain`), as the shell guard's does."""

from __future__ import annotations

import shlex

from hypothesis import example, given
from hypothesis import strategies as st

from tangram.runtime.sandboxfusion import runners, work
from tangram.runtime.sandboxfusion.runners import (
    MISSING_CODE,
    PLANS,
    missing_toolchain,
    plain_argv,
)


@given(st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=40))
@example("python3 main.py; rm -rf /")
@example("python3 $HOME")
@example("FOO=1 python3 main.py")
@example("python3 'a b'")
@example("python3 main.py > out")
@example("python3 *.py")
@example("python3 ~")
def test_a_plain_step_is_what_the_shell_would_have_run(command: str) -> None:
    words = plain_argv(command, (), ())
    if words is not None:
        assert shlex.split(command) == words
        assert all(shlex.quote(w) == w for w in words)  # no character the shell interprets
        assert "=" not in words[0]  # not a variable assignment


def test_the_guard_is_kept_where_it_checks_more_than_the_program() -> None:
    assert plain_argv("python3 main.py", ("python3",), ()) == ["python3", "main.py"]
    assert plain_argv("java -cp . Main", ("javac", "java"), ()) is None
    assert plain_argv("java -jar x.jar", ("java",), ("/usr/share/java/x.jar",)) is None
    assert plain_argv("/bin/bash main.sh", ("bash",), ()) is None
    # which runners' run steps start without a shell when their guard is on (as a request
    # with no compile step has it): their one tool and plain words, nothing else (a step
    # granted GPUs, python_gpu's, always has its guard: it does not start through the spawner)
    plain = {
        language
        for language, make in PLANS.items()
        if (plan := make("print(1)", [], [])).gpus is None
        and plain_argv(plan.run, plan.tools, plan.jars) is not None
    }
    assert plain == {
        "python", "nodejs", "typescript", "php", "ruby", "perl", "lua", "R", "julia", "scala",
        "kotlin_script", "swift", "racket", "go_test", "csharp",
    }  # fmt: skip


def test_the_spawners_not_found_line_is_a_missing_toolchain() -> None:
    path = "/usr/local/sbin:/usr/bin:/bin"
    line = f"tangram spawner: cannot run the command: lua: not found on PATH {path}\n"
    said = missing_toolchain(MISSING_CODE, line)
    assert said == f"toolchain missing in the sandbox: lua (not on the PATH {path})"
    guard = f"tangram: toolchain missing in the sandbox: lua (not on the PATH {path})\n"
    assert missing_toolchain(MISSING_CODE, guard) == said  # the shell guard's words
    assert missing_toolchain(1, line) is None  # only with the not-found exit code
    assert missing_toolchain(MISSING_CODE, "lua: oops\n" + line) is None  # the first line only


def test_a_step_granted_gpus_keeps_its_guard() -> None:
    """A GPU step runs in a device sandbox, not through the spawner that names a missing
    program: it keeps the staging shell and its guard, where `python` starts without them."""

    class Spawned:  # a local CPU manager whose commands start through a spawner
        @staticmethod
        def sandbox(env):
            return type("S", (), {"spawned": True})()

    tg = type("Tg", (), {"cpu": Spawned()})()
    for language, shell in (("python", False), ("python_gpu", True)):
        plan = PLANS[language]("print(1)", [], [])
        argv = work._argv(tg, "env", plan, ("", plan.run), {}, plan.guard(), work._NO_STDIN)
        assert (argv[:2] == ["sh", "-c"]) is shell, (language, argv)
        assert (runners.MISSING in " ".join(argv)) is shell  # the guard's words
