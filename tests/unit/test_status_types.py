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
from managers.cpu.backends.sim import SimBackend
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
from tangram.runtime.snapshot import PoolStatus, StatusSnapshot

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tangram", "managers", "solvers", "topology", "evaluation")
# the fields whose values are states, and the values each may take
STATES = {
    "status": {str(s) for s in Status} | {str(s) for s in SolveStatus},
    "order": {str(o) for o in Order},
}


def _field(node: ast.AST) -> str | None:
    """The field an expression names: `x.status` and `status` both name `status`."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)  # doc["status"]
    return None


def _literals(node: ast.AST | None) -> list[ast.Constant]:
    """The string constants of an expression: itself, or the items of a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [c for e in node.elts for c in _literals(e)]
    return []


def _state_literals(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, field, value) of every state literal: an argument `status=...`, the first
    argument of `Result(...)`, a comparison with or an assignment to a `status`/`order` field,
    a dict entry `"status": ...`."""
    found: list[tuple[int, str, list[ast.Constant]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _field(node.func)
            if name == "Result" and node.args:
                found.append((node.lineno, "status", _literals(node.args[0])))
            found += [
                (node.lineno, k.arg, _literals(k.value)) for k in node.keywords if k.arg in STATES
            ]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for f in {_field(s) for s in sides} & STATES.keys():
                found += [(node.lineno, f, _literals(s)) for s in sides]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [
                (node.lineno, f, _literals(node.value))
                for t in targets
                if (f := _field(t)) in STATES
            ]
        elif isinstance(node, ast.Dict):
            found += [
                (node.lineno, k.value, _literals(v))
                for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and k.value in STATES
            ]
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
        tg = await Tangram(cpu=CpuManager(SimBackend())).start()
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
        async with Tangram(cpu=CpuManager(SimBackend())) as tg:
            return tg.status()

    snap = asyncio.run(scenario())
    assert isinstance(snap, StatusSnapshot) and isinstance(snap.pools["cpu"], PoolStatus)
    assert snap.cpu_backend == "sim" and snap.queue == snap.running == snap.envs == 0
    doc = json.loads(json.dumps(snap.to_dict()))
    assert set(doc) == {f.name for f in dataclasses.fields(StatusSnapshot)}  # the wire keys
    assert doc["pools"]["cpu"]["utilisation"] == 0.0
    assert StatusSnapshot.from_dict(doc) == snap


def test_a_malformed_status_names_the_field():
    with pytest.raises(ValidationError) as err:
        StatusSnapshot.from_dict({"pools": {"cpu": {"free": 1}}, "queue": 0})
    assert err.value.field == "status.pools"
    with pytest.raises(ValidationError) as err:
        StatusSnapshot.from_dict({"pools": {}, "queue": 0})
    assert err.value.field == "status.policy"
