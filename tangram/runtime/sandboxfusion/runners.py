"""How each SandboxFusion language runs: its source file, compile and run command lines.

The command lines are SandboxFusion's own (its `sandbox/runners/major.py`), so a case that
passes there passes here: `g++ -std=c++17 <src> -o test` plus the optional libraries that link
on this system (`-lcrypto -lssl -lpthread`, probed once), `rustc <src> -o test` (no `-O`),
`go build -o out <src>`, `go test <src>_test.go`, Java always as `Main.java` with the class
path `.` + javatuples (where installed) + every `.jar` of the request's `files`, run with
`-ea`; JUnit with the file named after the code's public class (else `Main`), compiled
`javac -cp <cp> *.java` and run by the JUnit console launcher's `--scan-class-path`.

Which toolchains exist is decided *inside the sandbox*: the first step of every request starts
with a guard (`command -v` for each tool, `[ -f ]` for each jar) that runs in the sandbox's own
view (its PATH, its root filesystem: the host's, or an image's), so a language whose toolchain
the sandbox cannot see answers `SandboxError` naming the missing tool, never a compile error.

`python_gpu` and `cuda` run like `python` and a CUDA build (`nvcc main.cu -o test`, then
`./test`) with one GPU granted to the run step (`Plan.gpus`: a vector exec, its devices in the
sandbox); a server without a real GPU pool answers `SandboxError` saying so (`work.no_gpu`).
"""

from __future__ import annotations

import functools
import glob
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field

from managers.cpu.backends.bwrap.spawner import NOT_FOUND

MISSING = "tangram: toolchain missing in the sandbox:"  # the guard's stderr marker
MISSING_CODE = 127
# the words a shell passes on as they are (`shlex.quote`'s safe set)
_PLAIN = re.compile(r"[\w@%+=:,./-]+", re.ASCII)
JAVA_DIRS = ("/usr/share/java",)
JAVATUPLES = "javatuples*.jar"
JUNIT_CONSOLE = "junit-platform-console-standalone*.jar"
CPP_OPTIONAL_FLAGS = ("-lcrypto", "-lssl", "-lpthread")  # SandboxFusion's, in its order
GO_MOD = "module sandbox\n\ngo 1.18\n"
PHP_TAG = "<?php"


@dataclass(frozen=True, slots=True)
class Plan:
    """One request's work: write the code to `source` (and `extra` files the request does not
    give), run the guard for `tools` and `jars`, then `compile` (or nothing) and `run`."""

    source: str | None  # None: the code is not written (JUnit with an empty code)
    run: str
    compile: str | None = None
    tools: tuple[str, ...] = ()
    jars: tuple[str, ...] = ()  # absolute paths that must exist in the sandbox
    extra: dict[str, bytes] = field(default_factory=dict)
    code_prefix: str = ""
    gpus: int | None = None  # GPUs of the run step (None: none)

    def guard(self) -> str:
        """Shell lines that exit `MISSING_CODE` with `MISSING` on stderr when a tool or jar is
        not visible in the sandbox."""
        return _guard(self.tools, self.jars)


@functools.cache  # a few languages' tools and jars: built once each, not per request
def _guard(tools: tuple[str, ...], jars: tuple[str, ...]) -> str:
    checks = [
        f"command -v {shlex.quote(t)} >/dev/null 2>&1 || {{ echo "
        f'{shlex.quote(f"{MISSING} {t} (not on the PATH")} "$PATH)" >&2; '
        f"exit {MISSING_CODE}; }}"
        for t in tools
    ]
    checks += [
        f"[ -f {shlex.quote(j)} ] || {{ echo {shlex.quote(f'{MISSING} {j}')} >&2; "
        f"exit {MISSING_CODE}; }}"
        for j in jars
    ]
    return "".join(c + "\n" for c in checks)


def plain_argv(command: str, tools: tuple[str, ...], jars: tuple[str, ...]) -> list[str] | None:
    """`command` as an argv to start without a shell (one `sh` start fewer: ~1 ms a step), when
    it is plain words and its guard would check only its own program, which the spawner finds
    on the sandbox's PATH or names as missing (`spawner.NOT_FOUND`); else None."""
    words = command.split()
    if not words or jars or "=" in words[0] or not set(tools) <= {words[0]}:
        return None  # (a first word with "=" is a shell's variable assignment)
    return words if all(_PLAIN.fullmatch(w) for w in words) else None


def missing_toolchain(exit_code: int | None, stderr: str | None) -> str | None:
    """The guard's message when a step failed for a missing toolchain (said by the guard, or by
    the spawner for a step started without a shell), else None."""
    if exit_code != MISSING_CODE or not stderr:
        return None
    first = stderr.lstrip().splitlines()[0] if stderr.strip() else ""
    spawner = NOT_FOUND.fullmatch(first)  # a step started without a shell (`plain_argv`)
    if spawner is not None:
        tool, path = spawner.groups()
        return f"{MISSING.removeprefix('tangram: ')} {tool} (not on the PATH {path})"
    return first.removeprefix("tangram: ") if first.startswith(MISSING) else None


@functools.cache
def _find_jar(pattern: str) -> str | None:
    """The first jar matching `pattern` in the system's Java folders (visible in the sandbox:
    they are under /usr)."""
    for d in JAVA_DIRS:
        hits = sorted(glob.glob(f"{d}/{pattern}"))
        if hits:
            return hits[0]
    return None


@functools.cache
def cpp_flags() -> tuple[str, ...]:
    """Which of SandboxFusion's optional g++ libraries link here (probed once, as it does)."""
    found: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tangram-cpp-probe-") as d:
        src = f"{d}/probe.cpp"
        with open(src, "w") as f:
            f.write("int main() { return 0; }\n")
        for flag in CPP_OPTIONAL_FLAGS:
            try:
                done = subprocess.run(
                    ["g++", src, "-o", f"{d}/probe", flag], capture_output=True, timeout=60, cwd=d
                )
            except (OSError, subprocess.TimeoutExpired):
                break
            if done.returncode == 0:
                found.append(flag)
    return tuple(found)


_PUBLIC_CLASS = re.compile(
    r"^\s*public\s+(?:(?:final|abstract|static)\s+)*class\s+(\w+)", re.MULTILINE
)


def java_public_class(code: str) -> str | None:
    """The name of the code's public top-level class (JUnit's file name rule)."""
    m = _PUBLIC_CLASS.search(code)
    return m.group(1) if m else None


def _class_path(jars: list[str], files: list[str]) -> str:
    return ":".join([".", *jars, *[f for f in files if f.endswith(".jar")]])


def _java(code: str, files: list[str], args: list[str]) -> Plan:
    tuples = _find_jar(JAVATUPLES)
    cp = shlex.quote(_class_path([tuples] if tuples else [], files))
    return Plan(
        "Main.java", f"java -cp {cp} -ea Main", f"javac -cp {cp} Main.java", tools=("javac", "java")
    )


def _junit(code: str, files: list[str], args: list[str]) -> Plan:
    console = _find_jar(JUNIT_CONSOLE) or f"{JAVA_DIRS[0]}/junit-platform-console-standalone.jar"
    cp = shlex.quote(_class_path([console], files))
    source = f"{java_public_class(code) or 'Main'}.java" if code else None
    return Plan(
        source,
        f"java -jar {shlex.quote(console)} --class-path {cp} --scan-class-path",
        f"javac -cp {cp} *.java",
        tools=("javac", "java"),
        jars=(console,),
    )


def _cpp(code: str, files: list[str], args: list[str]) -> Plan:
    flags = " ".join(cpp_flags())
    return Plan(
        "main.cpp", "./test", f"g++ -std=c++17 main.cpp -o test {flags}".rstrip(), tools=("g++",)
    )


def _go(code: str, files: list[str], args: list[str]) -> Plan:
    extra = {} if "go.mod" in files else {"go.mod": GO_MOD.encode()}
    return Plan("main.go", "./out", "go build -o out main.go", tools=("go",), extra=extra)


def _go_test(code: str, files: list[str], args: list[str]) -> Plan:
    extra = {} if "go.mod" in files else {"go.mod": GO_MOD.encode()}
    return Plan("main_test.go", "go test main_test.go", tools=("go",), extra=extra)


def _pytest(code: str, files: list[str], args: list[str]) -> Plan:
    extra = " " + shlex.join(args) if args else ""
    return Plan(
        "test_main.py", f"python3 -m pytest $workers test_main.py{extra}", tools=("python3",)
    )


def _php(code: str, files: list[str], args: list[str]) -> Plan:
    return Plan(
        "main.php",
        "php -f main.php",
        tools=("php",),
        code_prefix="" if PHP_TAG in code else PHP_TAG + "\n",
    )


def _csharp(code: str, files: list[str], args: list[str]) -> Plan:
    # `dotnet new` writes its own Program.cs: the code goes in after it
    return Plan(
        ".tangram-Program.cs",
        "dotnet run --project .",
        "dotnet new console -o . --force >/dev/null && cp .tangram-Program.cs Program.cs",
        tools=("dotnet",),
    )


def _simple(source: str, command: str, tool: str, gpus: int | None = None):
    def plan(code: str, files: list[str], args: list[str]) -> Plan:
        return Plan(source, f"{command} {source}", tools=(tool,), gpus=gpus)

    return plan


def _cuda(code: str, files: list[str], args: list[str]) -> Plan:
    return Plan("main.cu", "./test", "nvcc main.cu -o test", tools=("nvcc",), gpus=1)


PLANS = {
    "python": _simple("main.py", "python3", "python3"),
    "python_gpu": _simple("main.py", "python3", "python3", gpus=1),
    "cuda": _cuda,
    "pytest": _pytest,
    "bash": _simple("main.sh", "/bin/bash", "bash"),
    "cpp": _cpp,
    "go": _go,
    "go_test": _go_test,
    "java": _java,
    "junit": _junit,
    "rust": lambda code, files, args: Plan(
        "main.rs", "./test", "rustc main.rs -o test", tools=("rustc",)
    ),
    "nodejs": _simple("main.js", "node", "node"),
    "typescript": _simple("main.ts", "tsx", "tsx"),
    "php": _php,
    "csharp": _csharp,
    "ruby": _simple("main.rb", "ruby", "ruby"),
    "perl": _simple("main.pl", "perl", "perl"),
    "lua": _simple("main.lua", "lua", "lua"),
    "R": _simple("main.R", "Rscript", "Rscript"),
    "julia": _simple("main.jl", "julia", "julia"),
    "scala": _simple("main.scala", "scala", "scala"),
    "kotlin_script": _simple("main.kts", "kotlinc -script", "kotlinc"),
    "swift": _simple("main.swift", "swift", "swift"),
    "racket": _simple("main.rkt", "racket", "racket"),
}


def plan_for(language: str, code: str, files: list[str], args: list[str]) -> Plan | str:
    """The language's plan, or why this server has no runner for it."""
    make = PLANS.get(language)
    if make is None:
        return (
            f"language {language!r} is not supported by this server (runners: "
            f"{', '.join(sorted(PLANS))})"
        )
    return make(code, files, args)
