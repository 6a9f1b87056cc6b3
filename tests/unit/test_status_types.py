"""States are types: no status, solver status or policy order is built from a string literal
outside its enum (an AST walk over every non-test module), and the errors that replaced text
matching (`ShuttingDown`, `NodeLost`) and `except TypeError` (unknown options) say what they
mean."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import managers.gpu
from managers.cpu import CpuManager
from managers.cpu.backends import create, started, unknown_options
from managers.cpu.backends.affinity import AffinityBackend
from managers.cpu.backends.sim import SimCpuBackend
from solvers.exact.backend import SolveStatus
from solvers.heuristic.backfill import BackfillAllocator, Order
from tangram.errors import (
    ActionFailed,
    BackendUnavailable,
    NodeLost,
    ShuttingDown,
    TangramError,
    ValidationError,
)
from tangram.pools import Placement
from tangram.results import Result, Status
from tangram.runtime.config import build_cpu
from tangram.runtime.facade import Tangram
from tangram.runtime.status import PoolStatus, StatusSnapshot

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tangram", "managers", "solvers", "topology", "evaluation")
# the fields whose values are states, and the values each may take
STATES = {
    "status": {str(s) for s in Status} | {str(s) for s in SolveStatus},
    "order": {str(o) for o in Order},
}


def _field(node: ast.AST, aliases: dict[str, str] | None = None) -> str | None:
    """The field an expression names: `x.status` and `status` both name `status`, and so do
    `str(x.status)`, `x.status.value`, `getattr(x, "status")`, `doc["status"]`, and a name or
    dict key that `aliases` maps to it (`s = x.status`; `{"call_status": str(x.status)}`,
    whose key is held as `"[call_status]"`)."""
    aliases = aliases or {}
    if isinstance(node, ast.Attribute):
        if node.attr == "value" and (inner := _field(node.value, aliases)) in STATES:
            return inner  # x.status.value
        return node.attr
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = str(node.slice.value)  # doc["status"]
        return aliases.get(f"[{key}]", key)
    if isinstance(node, ast.NamedExpr):
        return _field(node.value, aliases)  # (s := x.status)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "str" and len(node.args) == 1 and not node.keywords:
            return _field(node.args[0], aliases)
        if node.func.id == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                return name.value
    return None


def _literals(node: ast.AST | None) -> list[ast.Constant]:
    """The string constants of an expression: itself, or the items of a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [c for e in node.elts for c in _literals(e)]
    return []


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of one scope, less the bodies of the functions defined in it (their own
    scopes), with those functions' decorators and defaults (evaluated here)."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, FUNCTIONS):
            todo += [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]
            todo = [n for n in todo if n is not None]
        else:
            todo += ast.iter_child_nodes(node)
    return out


def _aliases(nodes: list[ast.AST], outer: dict[str, str], keys: bool) -> dict[str, str]:
    """Names given a state field's value in this scope (`s = r.status`, chains of them), with
    the enclosing scopes'; or (`keys`) the dict keys given one anywhere in `nodes` (a dict
    crosses scopes: `{"call_status": str(r.status)}` returned, `out["call_status"]` read)."""
    pairs: list[tuple[str, ast.AST]] = []
    for node in nodes:
        if keys and isinstance(node, ast.Dict):
            pairs += [
                (f"[{k.value}]", v)
                for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
        elif keys:
            continue
        elif isinstance(node, ast.Assign):
            pairs += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            if isinstance(node.target, ast.Name):
                pairs.append((node.target.id, node.value))
    out = dict(outer)
    changed = True
    while changed:  # to a fixpoint: `t = s` after `s = r.status`
        changed = False
        for name, value in pairs:
            f = _field(value, out)
            if name.strip("[]") not in STATES and f in STATES and out.get(name) != f:
                out[name], changed = f, True
    return out


def _scope_literals(nodes: list[ast.AST], al: dict[str, str]) -> list[tuple[int, str, list]]:
    found: list[tuple[int, str, list[ast.Constant]]] = []
    for node in nodes:
        if isinstance(node, ast.Call):
            name = _field(node.func)
            if name == "Result" and node.args:
                found.append((node.lineno, "status", _literals(node.args[0])))
            found += [
                (node.lineno, k.arg, _literals(k.value)) for k in node.keywords if k.arg in STATES
            ]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for f in {_field(s, al) for s in sides} & STATES.keys():
                found += [(node.lineno, f, _literals(s)) for s in sides]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [
                (node.lineno, f, _literals(node.value))
                for t in targets
                if (f := _field(t, al)) in STATES
            ]
        elif isinstance(node, ast.Dict):
            found += [
                (node.lineno, f, _literals(v))
                for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and (f := al.get(f"[{k.value}]", k.value)) in STATES
            ]
    return found


def _state_literals(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, field, value) of every state literal: an argument `status=...`, the first
    argument of `Result(...)`, a comparison with or an assignment to a `status`/`order` field
    (or a name or key holding one's value, per scope), a dict entry `"status": ...`."""
    found: list[tuple[int, str, list[ast.Constant]]] = []
    todo = [(tree, _aliases(list(ast.walk(tree)), {}, keys=True))]
    while todo:
        scope, outer = todo.pop()
        nodes = _own_nodes(scope)
        al = _aliases(nodes, outer, keys=False)
        found += _scope_literals(nodes, al)
        todo += [(n, al) for n in nodes if isinstance(n, FUNCTIONS)]
    return [(line, f, c.value) for line, f, cs in found for c in cs if c.value in STATES[f]]


def literal_states() -> list[str]:
    hits = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            hits += [
                f"{path.relative_to(ROOT)}:{line}: {f} = {v!r}"
                for line, f, v in _state_literals(tree)
            ]
    return hits


def test_no_state_is_built_from_a_string_literal():
    assert literal_states() == []


@pytest.mark.parametrize(
    "source",
    [
        'Result("failed", detail="x")',
        'dataclasses.replace(r, status="cancelled")',
        'ok = r.status not in ("error", "timeout")',
        'if s.status == "optimal": pass',
        'status = "timeout"',
        'Backfill(order="srpt")',
        'doc = {"status": "ok"}',
        # through a name or key holding a status, or the status turned into its text
        's = r.status\nif s in {"ok", "timeout"}: pass',
        'def f(r):\n    s = r.status\n    t = s\n    return t == "failed"',
        'def f(r):\n    if (s := r.status) == "ok": pass',
        'str(r.status) == "ok"',
        'r.status.value != "cancelled"',
        'getattr(r, "status") == "error"',
        'getattr(r, "status", None) in ("ok", "failed")',
        'out = {"call_status": str(r.status)}\nok = out["call_status"] == "ok"',
        'def f(r):\n    return {"st": r.status}\ndef g(r):\n    return f(r)["st"] == "ok"',
        's = r.status\ndef inner():\n    return s == "timeout"',
    ],
)
def test_the_walk_finds_each_kind_of_literal(source):
    assert _state_literals(ast.parse(source)), source


@pytest.mark.parametrize(
    "source",
    [
        "Result(Status.FAILED)",
        'r.detail == "error"',
        '{"error": "ok"}',
        'x = "failed"',
        'status = Status("ok")',
        # a name is an alias only in the scope that gave it a status
        'def f(r):\n    s = r.status\ndef g(s):\n    return s == "ok"',
        "s = r.status\nok = s is Status.OK",
        'str(r.detail) == "ok"',
        'getattr(r, "detail") == "failed"',
        'kind = r.kind\nkind == "timeout"',
        'out = {"call_status": str(r.status)}\nok = out["other"] == "ok"',
    ],
)
def test_the_walk_leaves_other_strings_alone(source):
    assert not _state_literals(ast.parse(source)), source


# -- the boundary: a status is parsed once, where it comes in ------------------------------------
def test_a_result_takes_only_the_enum():
    with pytest.raises(TypeError, match="Status"):
        Result("ok")  # type: ignore[arg-type]


def test_an_unknown_status_from_the_wire_names_field_and_value():
    with pytest.raises(ValidationError) as err:
        Result.from_dict({"status": "fine"})
    assert err.value.field == "status" and err.value.value == "fine"
    with pytest.raises(ValidationError) as err:
        Result.from_dict({"status": "ok", "placement": {"cpu": {"cores": [1]}}})
    assert err.value.field == "placement.cpu"


placements = st.builds(
    Placement,
    st.text(min_size=1, max_size=8),
    st.lists(st.integers(0, 255), max_size=4).map(tuple),
    st.none() | st.tuples(st.integers(0, 7), st.sampled_from([1, 2, 4, 8])),
)


@given(
    st.sampled_from(Status),
    st.dictionaries(st.sampled_from(["cpu", "gpu", "c2"]), placements, max_size=2),
)
def test_the_wire_form_round_trips(status, placement):
    """A result keeps its placements as objects; `to_dict` (JSON) and `from_dict` invert."""
    r = Result(status, 0, "out", placement=placement, units={r: 1 for r in placement})
    doc = json.loads(json.dumps(r.to_dict()))
    assert doc["status"] == str(status)
    assert Result.from_dict(doc) == r


def test_an_unknown_order_names_the_option():
    with pytest.raises(ValidationError) as err:
        BackfillAllocator(order="lifo")
    assert err.value.field == "allocator.order" and err.value.value == "lifo"
    assert BackfillAllocator(order="srpt").order is Order.SRPT


# -- errors that replaced text matching ------------------------------------------------------------
def test_shutting_down_and_a_lost_node_are_tangram_errors():
    assert issubclass(ShuttingDown, TangramError) and issubclass(NodeLost, ActionFailed)
    assert managers.gpu.NodeLost is NodeLost


def test_a_closing_runtime_refuses_with_shutting_down():
    async def scenario() -> None:
        tg = await Tangram(cpu=CpuManager(SimCpuBackend())).start()
        await tg.shutdown()
        with pytest.raises(ShuttingDown):
            await tg.open_env("t")

    asyncio.run(scenario())


# -- options checked by name, not by catching TypeError -------------------------------------------
def test_an_unknown_backend_option_names_the_option():
    with pytest.raises(ValidationError) as err:
        create("sim", pids_max=4)
    assert err.value.field == "cpu.options" and err.value.value == ["pids_max"]
    assert "time_scale" in err.value.problem  # what it does take
    assert unknown_options("bwrap", {"pids_max": 4, "image": "x"}) == ["image"]


def test_auto_skips_a_backend_that_does_not_take_an_option():
    """`image` is the docker backend's alone: auto names that every other one skipped it."""
    with pytest.raises(BackendUnavailable) as err:
        asyncio.run(
            started(None, image="no-such-image:0", base_url="unix:///nonexistent/docker.sock")
        )
    for name in ("bwrap", "cgroup", "affinity", "sim"):
        assert f"{name}: does not take" in str(err.value)


def test_a_config_with_a_bad_cpu_option_names_it():
    with pytest.raises(ValidationError) as err:
        build_cpu("cpu", {"backend": "sim", "options": {"pids_max": 4}})
    assert err.value.field == "cpu.options.pids_max" and err.value.value == 4


# -- the status snapshot ---------------------------------------------------------------------------
def test_the_status_snapshot_is_typed_and_its_json_round_trips():
    async def scenario() -> StatusSnapshot:
        async with Tangram(cpu=CpuManager(SimCpuBackend())) as tg:
            return tg.status()

    snap = asyncio.run(scenario())
    assert isinstance(snap, StatusSnapshot) and isinstance(snap.pools["cpu"], PoolStatus)
    assert snap.cpu_backend == "sim" and snap.queue == snap.running == snap.envs == 0
    doc = json.loads(json.dumps(snap.to_dict()))
    assert set(doc) == {f.name for f in dataclasses.fields(StatusSnapshot)}  # the wire keys
    assert doc["pools"]["cpu"]["utilisation"] == 0.0
    assert StatusSnapshot.from_dict(doc) == snap


def test_the_status_says_what_an_unisolating_backend_does_not_guarantee():
    async def scenario() -> StatusSnapshot:
        async with Tangram(cpu=CpuManager(AffinityBackend())) as tg:
            return tg.status()

    snap = asyncio.run(scenario())
    assert snap.cpu_lost is not None and "no sandbox" in snap.cpu_lost
    assert StatusSnapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap


def test_a_malformed_status_names_the_field():
    with pytest.raises(ValidationError) as err:
        StatusSnapshot.from_dict({"pools": {"cpu": {"free": 1}}, "queue": 0})
    assert err.value.field == "status.pools"
    with pytest.raises(ValidationError) as err:
        StatusSnapshot.from_dict({"pools": {}, "queue": 0})
    assert err.value.field == "status.policy"
