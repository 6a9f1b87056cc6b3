"""One owner per environment (docs/architecture.md, "Environments"): its state is one `EnvState`
on one `EnvRecord` in the CPU manager's `EnvironmentTable`; every backend keeps what it holds
for an environment on that environment's `Sandbox`, and one `ExecSpec` carries a command from the
manager to the sandbox and the spawner. These read the code (its AST, its classes) for what
would bring the old scattering back, and drive the state machine through every pair of states."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
from pathlib import Path

import pytest

import managers.cpu.backends as backends_pkg
from managers.cpu.backends.base import Backend, Sandbox
from managers.cpu.backends.bwrap.spawner import Spawner
from managers.cpu.environments import (
    NEXT,
    SETTLING,
    Environment,
    EnvRecord,
    EnvState,
    IllegalTransition,
)
from managers.cpu.request import ExecSpec

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("managers", "tangram", "evaluation")
TABLE = ROOT / "managers" / "cpu" / "environments.py"
# what names an environment's id in code: a lookup keyed by one of these is a table of
# environments
ENV_KEYS = ("env.id", "env_id", "record.id", "e.id", "req.env_id", "request.env_id")
LOOKUPS = ("pop", "get", "setdefault", "add", "discard", "remove", "__getitem__")


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _keyed_by_env(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, code) of each store, delete or lookup keyed by an environment id whose
    container is not the environment table (`<something>.envs`, the manager's)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            key, container = node.slice, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LOOKUPS
            and node.args
        ):
            key, container = node.args[0], node.func.value
        else:
            continue
        if ast.unparse(key) not in ENV_KEYS:
            continue
        if isinstance(container, ast.Attribute) and container.attr == "envs":
            continue  # the table itself (`self.envs`, `m.envs`): its methods, not a mapping
        if isinstance(container, ast.Name) and container.id == "envs":
            continue
        found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_no_mapping_keyed_by_environment_id_outside_the_table():
    bad = []
    for path in _sources():
        if path == TABLE:
            continue
        for line, code in _keyed_by_env(ast.parse(path.read_text())):
            bad.append(f"{path.relative_to(ROOT)}:{line}: {code}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_table_keyed_by_environment_id():
    """The check above can fail: each shape the old code had is caught."""
    for code in (
        "self._holders[env.id] = holder",
        "self._uids.pop(env.id, None)",
        "h = self._envs.get(env_id)",
        "del self._busy[env_id]",
        "self._own_workdirs.add(env.id)",
    ):
        assert _keyed_by_env(ast.parse(code)), code
    assert not _keyed_by_env(ast.parse("r = self.envs.record(env_id); self.envs.get(env_id)"))


def test_one_state_type_for_environments():
    """Only `EnvState` says where an environment is in its life: no other enum, and no
    module-level or class-level table of environments' states, anywhere."""
    enums = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).endswith(("Enum", "StrEnum")) for b in node.bases
            ):
                if "env" in node.name.lower() or "sandbox" in node.name.lower():
                    enums.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert enums == ["managers/cpu/environments.py:EnvState"], enums


@pytest.mark.parametrize(("now", "then"), list(itertools.product(EnvState, EnvState)))
def test_a_transition_is_legal_exactly_where_next_says(now, then):
    record = EnvRecord(Environment("env-a", "t", "n", 64, "/w"), now)
    if then in NEXT[now]:
        record.to(then, "why")
        assert record.state is then
        assert then is not EnvState.BROKEN or record.why == "why"
    else:
        with pytest.raises(IllegalTransition, match=f"{now.value} cannot become {then.value}"):
            record.to(then)
        assert record.state is now


def test_every_state_but_closed_leads_somewhere_and_every_one_can_close():
    assert set(NEXT) == set(EnvState)
    assert NEXT[EnvState.CLOSED] == frozenset()
    for state in EnvState:
        if state is not EnvState.CLOSED:
            assert NEXT[state], state
    # from every state a path leads to CLOSED (nothing is stuck open)
    for state in EnvState:
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in NEXT[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert EnvState.CLOSED in seen, state
    assert SETTLING <= set(EnvState)


def _all_backend_modules() -> None:
    for info in pkgutil.walk_packages(backends_pkg.__path__, f"{backends_pkg.__name__}."):
        if info.name.endswith("spawner_inside"):  # runs inside a sandbox, not imported
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional engine's client (docker) missing here
            continue


def _subclasses(cls: type) -> list[type]:
    out, todo = [], list(cls.__subclasses__())
    while todo:
        c = todo.pop()
        out.append(c)
        todo += c.__subclasses__()
    return out


def test_no_backend_or_sandbox_overrides_a_public_template_method():
    """The shared rules live in `Backend.open/start/shutdown/sweep` and `Sandbox.exec/close/
    serving`; a backend fills in the protected hooks, never the public methods."""
    _all_backend_modules()
    backends = [c for c in _subclasses(Backend) if c.__module__.startswith("managers.")]
    sandboxes = [c for c in _subclasses(Sandbox) if c.__module__.startswith("managers.")]
    assert {"BwrapBackend", "CgroupBackend", "AffinityBackend", "SimCpuBackend"} <= {
        c.__name__ for c in backends
    }
    assert {"BwrapSandbox", "CgroupSandbox", "AffinitySandbox", "SimSandbox"} <= {
        c.__name__ for c in sandboxes
    }
    for cls in backends:
        for name in ("open", "start", "shutdown", "sweep"):
            assert name not in vars(cls), f"{cls.__name__} overrides {name}"
    for cls in sandboxes:
        for name in ("exec", "close", "serving", "environ"):
            assert name not in vars(cls), f"{cls.__name__} overrides {name}"


def test_one_exec_spec_from_the_manager_to_the_spawner():
    """Each sandbox's `_run`, the template's `exec` and the spawner's `run` take the one
    `ExecSpec`, not a copy of its fields."""
    _all_backend_modules()
    for cls in [Sandbox, *_subclasses(Sandbox)]:
        if not cls.__module__.startswith("managers."):
            continue
        for name in ("exec", "_run"):
            fn = vars(cls).get(name)
            if fn is None:
                continue
            params = list(inspect.signature(fn).parameters.values())
            assert [p.name for p in params] == ["self", "spec"], (cls.__name__, name)
            assert params[1].annotation in ("ExecSpec", ExecSpec), (cls.__name__, name)
    params = inspect.signature(Spawner.run).parameters
    assert list(params)[1] == "spec" and params["spec"].annotation in ("ExecSpec", ExecSpec)
    assert not {"timeout", "output_cap", "argv"} & set(params)
