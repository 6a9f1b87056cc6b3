"""Survivors of mutation testing in the scheduler's queue (`tangram/queue.py`,
docs/mutation.md): membership by the action itself, the `visited` cost counter, `only`, and
`copy`'s independence."""

from __future__ import annotations

from tangram.actions import Action
from tangram.queue import ActionQueue


def _never(_: object) -> bool:
    return False


def _queue() -> tuple[ActionQueue, list[Action]]:
    q = ActionQueue()
    acts = [
        Action("a", {"cpu": 1}, duration=1.0),
        Action("b", {"cpu": 1, "api": 1}, duration=1.0),  # two classes
        Action("c", {"api": 1}, duration=1.0),
    ]
    for a in acts:
        q.add(a, [(r, None) for r in a.mins])
    return q, acts


def test_membership_is_by_id_or_by_the_very_action():
    q, (a, b, _) = _queue()
    assert a in q and "a" in q
    assert Action("a", {"cpu": 1}, duration=1.0) not in q  # another action with that id
    assert Action("z", {"cpu": 1}, duration=1.0) not in q and "z" not in q


def test_visited_counts_each_action_yielded_once():
    q, acts = _queue()
    assert [a.id for a in q.scan(_never)] == ["a", "b", "c"]  # b once, though in two classes
    assert q.visited == 3
    assert [a.id for a in q.scan(_never, [("cpu", None)])] == ["a", "b"]  # one class: no merge
    assert q.visited == 5


def test_only_restricts_the_walk_to_those_classes():
    q, _ = _queue()
    assert [a.id for a in q.scan(_never, [("api", None)])] == ["b", "c"]
    assert list(q.scan(_never, [("gpu", None)])) == []  # a class nothing waits in


def test_a_copy_holds_the_same_actions_in_order_and_is_independent():
    q, acts = _queue()
    c = q.copy()
    assert [a.id for a in c.scan(_never)] == ["a", "b", "c"]
    assert c.classes_of("b") == (("cpu", None), ("api", None))
    q.remove("a")
    late = Action("d", {"cpu": 1}, duration=1.0)
    c.add(late, [("cpu", None)])
    assert [a.id for a in c.scan(_never)] == ["a", "b", "c", "d"]  # arrival order kept
    assert [a.id for a in q.scan(_never)] == ["b", "c"] and "d" not in q
