"""SandboxFusion-style runner cases, per language, over HTTP against a real `tangram serve` with
the bwrap sandbox (SandboxFusion's own runner tests are not shipped with its SDK; these are the
same kinds of case: hello world, stdin, a failing program, a compile error, a timeout, the
language's test framework passing and failing).

Each case holds both ways: where the sandbox can see the language's toolchain (the host's
system PATH: what the sandbox binds) the case must pass as SandboxFusion answers it; where it
cannot, the answer must be a `SandboxError` whose message names the missing tool, never a
compile error. `pytest -v` on this file is the pass table per language.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.grant import SAFE_PATH
from tangram.runtime.facade import Tangram
from tangram.runtime.sandboxfusion.runners import PLANS
from tangram.runtime.server import create_app, serve_in_thread

pytestmark = [pytest.mark.cgroup]
WHY = BwrapBackend.probe()

JUNIT_PASS = """import org.junit.jupiter.api.Test;
import static org.junit.jupiter.api.Assertions.assertEquals;

public class AdderTest {
    @Test
    void adds() { assertEquals(3, 1 + 2); }
}
"""
GO_TEST = """package main

import "testing"

func TestAdd(t *testing.T) {
	if 1+2 != %s {
		t.Fatal("wrong sum")
	}
}
"""
CPP_SSL = """#include <openssl/sha.h>
#include <cstdio>
int main() {
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char*)"abc", 3, d);
    printf("%02x%02x\\n", d[0], d[1]);
}
"""

# The kind of case SandboxFusion's own runner tests send over HTTP (its test_pytest.py): a
# test file using pytest's fixtures, passing and failing, also sent as plain python (which
# only defines the tests: Success either way), and pytest `args` forwarded as arguments.
FIXTURES = """from collections import Counter

def letters(path):
    return Counter(c for c in open(path).read().lower() if c.isalpha())

class TestLetters:
    def test_counts(self, tmp_path, capfd):
        p = tmp_path / "t.txt"
        p.write_text("AaB!")
        print(dict(letters(p)))
        assert "{'a': 2, 'b': 1}" %s capfd.readouterr().out
"""
SELECT = "def test_wanted():\n    assert True\n\ndef test_unwanted():\n    assert False\n"

# (id, language, body extras, expected status, check of the response)
CASES = [
    (
        "pytest-fixtures-pass",
        "pytest",
        {"code": FIXTURES % "in"},
        "Success",
        lambda d: "1 passed" in d["run_result"]["stdout"],
    ),
    (
        "pytest-fixtures-fail",
        "pytest",
        {"code": FIXTURES % "not in"},
        "Failed",
        lambda d: "1 failed" in d["run_result"]["stdout"],
    ),
    (
        "python-defines-tests-only",
        "python",
        {"code": FIXTURES % "not in"},
        "Success",
        lambda d: d["run_result"]["return_code"] == 0,
    ),
    (
        "pytest-args-select",
        "pytest",
        {"code": SELECT, "args": ["-k", "wanted and not unwanted"]},
        "Success",
        lambda d: "1 passed, 1 deselected" in d["run_result"]["stdout"],
    ),
    (
        "pytest-args-not-a-shell",
        "pytest",
        {
            "code": SELECT,
            "args": ["-k", "wanted and not unwanted", "$(touch /tmp/pwned)", "; touch /tmp/pwned"],
            "fetch_files": ["/tmp/pwned"],
        },
        "Failed",
        lambda d: d["files"] == {} and d["run_result"]["return_code"] == 4,
    ),
    (
        "python-hello",
        "python",
        {"code": "print('hello')"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "hello\n",
    ),
    (
        "python-stdin",
        "python",
        {"code": "print(int(input()) * 2)", "stdin": "21\n"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "42\n",
    ),
    (
        "python-raise",
        "python",
        {"code": "raise ValueError('boom')"},
        "Failed",
        lambda d: d["run_result"]["return_code"] == 1 and "boom" in d["run_result"]["stderr"],
    ),
    (
        "python-timeout",
        "python",
        {"code": "while True: pass", "run_timeout": 0.5},
        "Failed",
        lambda d: d["run_result"]["status"] == "TimeLimitExceeded",
    ),
    (
        "python-abs-files",
        "python",
        {
            "code": "print(open('/tmp/in.txt').read()); open('/tmp/out.txt', 'w').write('x')",
            "files": {"/tmp/in.txt": base64.b64encode(b"abs").decode()},
            "fetch_files": ["/tmp/out.txt"],
        },
        "Success",
        lambda d: (
            d["run_result"]["stdout"] == "abs\n"
            and base64.b64decode(d["files"]["/tmp/out.txt"]) == b"x"
        ),
    ),
    (
        "pytest-pass",
        "pytest",
        {"code": "def test_a():\n    assert 1 + 1 == 2\n"},
        "Success",
        lambda d: "1 passed" in d["run_result"]["stdout"],
    ),
    (
        "pytest-fail",
        "pytest",
        {"code": "def test_a():\n    assert 1 + 1 == 3\n"},
        "Failed",
        lambda d: "1 failed" in d["run_result"]["stdout"],
    ),
    (
        "bash-hello",
        "bash",
        {"code": "echo hi; exit 0"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "hi\n",
    ),
    (
        "bash-exit",
        "bash",
        {"code": "exit 3"},
        "Failed",
        lambda d: d["run_result"]["return_code"] == 3,
    ),
    (
        "cpp-stdin",
        "cpp",
        {
            "code": "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;"
            "std::cout<<a+b<<std::endl;}",
            "stdin": "2 3",
        },
        "Success",
        lambda d: d["run_result"]["stdout"] == "5\n" and d["compile_result"]["return_code"] == 0,
    ),
    (
        "cpp-compile-error",
        "cpp",
        {"code": "int main() { return x; }"},
        "Failed",
        lambda d: d["compile_result"]["return_code"] != 0 and d["run_result"] is None,
    ),
    (
        "cpp-openssl",
        "cpp",
        {"code": CPP_SSL},
        "Success",
        lambda d: d["run_result"]["stdout"] == "ba78\n",
    ),
    (
        "java-stdin",
        "java",
        {
            "code": "import java.util.*;\npublic class Main { public static void "
            "main(String[] a) { Scanner s = new Scanner(System.in); "
            "System.out.println(s.nextInt() + 1); } }",
            "stdin": "41",
        },
        "Success",
        lambda d: d["run_result"]["stdout"] == "42\n",
    ),
    (
        "java-assert",
        "java",
        {
            "code": "public class Main { public static void main(String[] a) "
            '{ assert 1 == 2 : "no"; } }'
        },
        "Failed",
        lambda d: "AssertionError" in d["run_result"]["stderr"],
    ),
    (
        "java-compile-error",
        "java",
        {"code": "public class Main { void f() { int x = ; } }"},
        "Failed",
        lambda d: d["run_result"] is None,
    ),
    (
        "junit-pass",
        "junit",
        {"code": JUNIT_PASS},
        "Success",
        lambda d: "1 tests successful" in d["run_result"]["stdout"],
    ),
    (
        "junit-fail",
        "junit",
        {"code": JUNIT_PASS.replace("3, 1 + 2", "4, 1 + 2")},
        "Failed",
        lambda d: "1 tests failed" in d["run_result"]["stdout"],
    ),
    (
        "go-hello",
        "go",
        {"code": 'package main\nimport "fmt"\nfunc main() { fmt.Println("go") }'},
        "Success",
        lambda d: d["run_result"]["stdout"] == "go\n",
    ),
    (
        "go-compile-error",
        "go",
        {"code": "package main\nfunc main() { x }"},
        "Failed",
        lambda d: d["run_result"] is None,
    ),
    (
        "go_test-pass",
        "go_test",
        {"code": GO_TEST % "3"},
        "Success",
        lambda d: "ok" in d["run_result"]["stdout"],
    ),
    (
        "go_test-fail",
        "go_test",
        {"code": GO_TEST % "4"},
        "Failed",
        lambda d: "wrong sum" in d["run_result"]["stdout"],
    ),
    (
        "rust-hello",
        "rust",
        {"code": 'fn main() { println!("rs"); }'},
        "Success",
        lambda d: d["run_result"]["stdout"] == "rs\n",
    ),
    (
        "nodejs-hello",
        "nodejs",
        {"code": "console.log(6 * 7)"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "42\n",
    ),
    (
        "nodejs-exit",
        "nodejs",
        {"code": "process.exit(4)"},
        "Failed",
        lambda d: d["run_result"]["return_code"] == 4,
    ),
    (
        "typescript-hello",
        "typescript",
        {"code": "const x: number = 1; console.log(x)"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "1\n",
    ),
    (
        "php-hello",
        "php",
        {"code": "echo 'php';"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "php",
    ),
    (
        "perl-hello",
        "perl",
        {"code": "print 'pl';"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "pl",
    ),
    (
        "ruby-hello",
        "ruby",
        {"code": "puts 'rb'"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "rb\n",
    ),
    (
        "lua-hello",
        "lua",
        {"code": "print('lua')"},
        "Success",
        lambda d: d["run_result"]["stdout"] == "lua\n",
    ),
]


def visible(language: str, body: dict) -> list[str]:
    """The tools of `language` the sandbox cannot see (it binds the host's system folders and
    runs with the fixed system PATH)."""
    plan = PLANS[language](body["code"], list(body.get("files", {})), [])
    return [t for t in plan.tools if shutil.which(t, path=SAFE_PATH) is None]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    if WHY is not None:
        pytest.skip(f"bwrap backend unavailable: {WHY}")
    root = str(tmp_path_factory.mktemp("sf-runners"))
    tg = Tangram(cpu=CpuManager(BwrapBackend(), workdir_root=root))
    with serve_in_thread(create_app(tg)) as u:
        yield u


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_case(url: str, case) -> None:
    _, language, body, status, check = case
    # generous limits: compilers on one core of a loaded machine (go test builds its binary)
    limits = {"compile_timeout": 120, "run_timeout": 120}
    r = httpx.post(f"{url}/run_code", json={"language": language, **limits, **body}, timeout=600)
    assert r.status_code == 200, r.text
    d = r.json()
    missing = visible(language, body)
    if missing:
        assert d["status"] == "SandboxError", d
        assert missing[0] in d["message"] and "toolchain missing" in d["message"], d
        return
    assert d["status"] == status, d
    assert check(d), d


def test_a_memory_kill_says_so_where_clients_look(url: str) -> None:
    """The cgroup's kill keeps its return code and names the limit on stderr (SandboxFusion's
    clients read stderr; there the limit shows as the program's own MemoryError)."""
    r = httpx.post(
        f"{url}/run_code",
        json={
            "language": "python",
            "memory_limit_MB": 64,
            "code": "print('before', flush=True)\nx = bytearray(400 << 20)\nx[::4096] = b'1' * "
            "len(x[::4096])\nprint('after')",
        },
        timeout=120,
    )
    d = r.json()
    assert d["status"] == "Failed" and d["run_result"]["stdout"] == "before\n", d
    assert "out of memory (limit 64 MiB)" in d["run_result"]["stderr"], d


def test_the_run_timeout_kills_at_its_limit_and_not_before(url: str) -> None:
    """A program that sleeps 0.4 s inside a 1 s limit finishes (the limit counts from the
    program's start: the sandbox's set-up and the staging of the files are outside it); one
    that sleeps 3 s is killed."""
    ok = httpx.post(
        f"{url}/run_code",
        json={
            "language": "python",
            "code": "import time; time.sleep(0.4); print('done')",
            "run_timeout": 1.0,
        },
        timeout=120,
    ).json()
    late = httpx.post(
        f"{url}/run_code",
        json={"language": "python", "code": "import time; time.sleep(3)", "run_timeout": 1.0},
        timeout=120,
    ).json()
    assert ok["status"] == "Success" and ok["run_result"]["stdout"] == "done\n", ok
    assert late["run_result"]["status"] == "TimeLimitExceeded", late
