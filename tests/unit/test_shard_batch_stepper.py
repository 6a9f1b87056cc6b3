"""The node shard's side of a batch (`tangram.runtime.shards.batches`, docs/scale.md
"Batches"), on a recording worker: each instant decided with the learned means of that instant,
no decision while the shard's queue is empty (the work applied all the same, in order), a put-off
class woken at its due instant, and the op stream cut at the last instant."""

from __future__ import annotations

import pickle

import pytest

from tangram.actions import Action, Elasticity
from tangram.results import Status
from tangram.runtime.shards.batches import BatchStepper, MeanChanges, Ops
from tangram.runtime.shards.wire import to_wire


def _changes(*triples: tuple[int, str, float]) -> tuple:
    """The means learned after a batch's first instant, as the router sends them."""
    out = MeanChanges()
    for t in triples:
        out.append(*t)
    return out.wire()


_NO_CHANGES = _changes()


class _Sched:
    """What the stepper drives of a scheduler: the ops applied in order, recorded."""

    def __init__(self) -> None:
        self.profiles = type("P", (), {"means": {}})()
        self.queue: dict[str, object] = {}
        self.wants: bool | float = False
        self.applied: list = []  # the ops since the last decision
        self.completions: list = []  # (id, time, status) as applied

    def wants_next_decision(self):
        return self.wants

    def enqueue(self, a) -> None:
        self.queue[a] = a
        self.applied.append(a)

    def complete(self, aid, now, status=None) -> None:
        self.applied.append(aid)
        self.completions.append((aid, now, status))

    def cancel(self, aid) -> None:
        self.queue.pop(aid, None)
        self.applied.append(("cancels", aid))

    def bind(self, *v) -> None:
        self.applied.append(("binds", v))

    def unbind(self, t) -> None:
        self.applied.append(("unbinds", t))


class _Worker:
    """Records each decision (time, means then, the ops applied since the last one) and
    starts the first queued action, if any, wanting to decide again as told."""

    def __init__(self, wants=False, queued=()) -> None:
        self.sched = _Sched()
        self.sched.wants = wants
        self.sched.queue.update((q, q) for q in queued)
        self.log: list = []

    @property
    def completed(self) -> list:
        return [op for t, m, ops in self.log for op in ops if isinstance(op, str)]

    def decide(self, now):
        self.log.append((now, dict(self.sched.profiles.means), self.sched.applied))
        self.sched.applied = []
        if not self.sched.queue:
            return []
        first = next(iter(self.sched.queue))
        if self.sched.wants is not False:  # a put-off class: it keeps waiting
            return []
        del self.sched.queue[first]
        return [first]


def _arr(name: str):
    """An arrival in an op stream (anything but a str, an int or a tuple is one)."""
    return type("Arrival", (), {"__repr__": lambda self: name})()


def test_a_batch_decides_each_instant_with_the_means_of_that_instant():
    w = _Worker()
    stepper = BatchStepper(w)
    a, b = _arr("a"), _arr("b")
    instants = [1.0, 2.0, 3.0, 4.0]
    changes = _changes((1, "tool", 2.0), (2, "tool", 3.0), (2, "reward", 9.0), (3, "tool", 4.0))
    stepper.run((instants, {"tool": 1.0}, changes), [a, 0, "x", 2, b, 3])
    # at 3.0 only a completion, with a started and nothing queued: held until 4.0
    assert [(t, m) for t, m, _ in w.log] == [
        (1.0, {"tool": 1.0}),
        (4.0, {"tool": 4.0, "reward": 9.0}),
    ]


def test_a_batch_holds_work_while_the_queue_is_empty_and_wakes_when_due():
    """Work for a shard whose queue stays empty makes no decision (the per-instant router would
    not have asked it) and is applied, in order, before the next one; a put-off class due at
    time t is decided at the first instant at or after t, not before."""
    a = _arr("a")
    w = _Worker()
    stepper = BatchStepper(w)
    stepper.run(([1.0, 2.0], {}, _NO_CHANGES), ["x", 0, a, 1])
    assert [(t, ops) for t, _, ops in w.log] == [(2.0, ["x", a])]

    w = _Worker(wants=2.5)
    stepper = BatchStepper(w)
    _, wake = stepper.run(([1.0, 2.0, 2.5, 3.0], {}, _NO_CHANGES), [a, 0])
    assert [t for t, _, _ in w.log] == [1.0, 2.5, 3.0]  # due again after each decision
    assert wake == 2.5

    w = _Worker(wants=True)
    stepper = BatchStepper(w)
    stepper.run(([1.0, 2.0, 3.0], {}, _NO_CHANGES), [a, 1])
    assert [t for t, _, _ in w.log] == [2.0, 3.0]


def test_an_op_stream_splits_at_the_last_instant_and_applies_in_order():
    a, b = _arr("a"), _arr("b")
    ops = Ops()
    ops.arrivals.append(a)
    ops.binds.append(("t", "cpu", "n0"))
    ops.mark(0)
    ops.completes.append("x")
    ops.cancels.append("y")
    ops.unbinds.append("t")
    ops.mark(3)
    ops.arrivals.append(b)  # after the last instant: the next batch's
    sent, rest = ops.split()
    assert rest.arrivals == [b] and rest.cut == 0
    w = _Worker(queued=["q"])
    BatchStepper(w).run(([1.0, 2.0, 3.0, 4.0], {}, _NO_CHANGES), sent)
    assert [(t, ops) for t, _, ops in w.log] == [
        (1.0, [a, ("binds", ("t", "cpu", "n0"))]),
        (4.0, ["x", ("cancels", "y"), ("unbinds", "t")]),
    ]


def test_a_batch_answers_each_decisions_grants_and_its_wish_to_decide_again():
    a, b = _arr("a"), _arr("b")
    w = _Worker()
    stepper = BatchStepper(w)
    got, wake = stepper.run(([0.5, 0.6], {}, _changes((1, "k", 1.0))), [a, 0, b, 1])
    assert got == [(0, [a]), (1, [b])]
    assert wake is False and w.sched.profiles.means == {"k": 1.0}
    w = _Worker(wants=True)  # a put-off class: decided again at the next instant, and after
    stepper = BatchStepper(w)
    got, wake = stepper.run(([0.1, 0.2, 0.3], {}, _NO_CHANGES), [a, 0])
    assert [t for t, _, _ in w.log] == [0.1, 0.2, 0.3] and got == [(0, []), (1, []), (2, [])]
    assert wake is True
    w.sched.queue.clear()
    assert stepper.run(([0.4], {}, _NO_CHANGES), [])[1] is False  # nothing queued: no wish


def test_a_fresh_shard_decides_only_when_asked_and_means_apply_in_order():
    w = _Worker(queued=["q"])
    stepper = BatchStepper(w)
    stepper.run(([1.0, 2.0], {"k": 1.0}, _changes((1, "other", 5.0))), [1])
    assert [(t, m) for t, m, _ in w.log] == [(2.0, {"k": 1.0, "other": 5.0})]


def test_work_with_an_empty_queue_is_applied_and_cancels_of_the_queue_count():
    """Two instants of completions only (the queue stays empty) decide nothing and are both
    applied before the next decision; a cancel of the only queued action empties the queue (no
    decision); a cancel of an id not queued does not."""
    a = _arr("a")
    w = _Worker()
    stepper = BatchStepper(w)
    stepper.run(([1.0, 2.0, 3.0], {}, _NO_CHANGES), ["x", 0, "y", 1, a, 2])
    assert [t for t, _, _ in w.log] == [3.0] and w.completed == ["x", "y"]
    for cancelled, decided in (("q", []), ("elsewhere", [1.0])):
        w = _Worker(queued=["q"], wants=True)
        ops = Ops()
        ops.cancels.append(cancelled)
        ops.mark(0)
        BatchStepper(w).run(([1.0], {}, _NO_CHANGES), ops.split()[0])
        assert [t for t, _, _ in w.log] == decided
        assert w.sched.applied == ([] if decided else [("cancels", cancelled)])
        assert list(w.sched.queue) == (["q"] if decided else [])  # "q" waits (put off)


def test_the_routers_open_batch_asks_a_shard_whose_put_off_class_is_due():
    from tangram.runtime.shards.batches import OpenBatch

    b = OpenBatch(3)
    assert (b.instants, b.wake, b.ready, b.first_id) == ([], [False] * 3, [], 0)
    b.instants = [1.0, 2.0, 3.0]
    b.wake = [False, True, 3.5]
    assert [b.wants(i) for i in range(3)] == [False, True, False]
    b.wake[2] = 2.5  # due by the batch's last instant, though after its second
    assert b.wants(2)
    b.wake[2] = 3.0  # due at the last instant itself
    assert b.wants(2)
    b.queued, b.inline = [1, 1, 1], {1: ["g"]}
    b.changes.append(1, "k", 1.0)
    b.close()
    assert (b.first_id, b.instants, b.queued, b.inline) == (3, [], [], {})
    assert b.changes.triples() == []
    assert not b.wants(2)  # no instant open: nothing is due
    b.instants = [4.0]
    b.close()
    assert b.first_id == 4


def test_a_wish_to_decide_carries_into_the_next_batch():
    a = _arr("a")
    w = _Worker(wants=True)
    stepper = BatchStepper(w)
    stepper.run(([0.1], {}, _NO_CHANGES), [a, 0])
    got, _ = stepper.run(([0.2, 0.3], {}, _changes((1, "late", 1.0))), [])
    assert got == [(0, []), (1, [])]  # from the new batch's first instant on
    w = _Worker(wants=2.5)
    stepper = BatchStepper(w)
    stepper.run(([1.0], {}, _NO_CHANGES), [a, 0])
    got, _ = stepper.run(([2.4, 2.6, 2.7], {}, _changes((2, "late", 1.0))), [])
    assert [j for j, _ in got] == [1, 2]
    w.sched.wants = False
    got, _ = stepper.run(([2.8, 2.9], {}, _changes((1, "later", 2.0))), [])
    assert [j for j, _ in got] == [0]  # decided at once (due), then no wish
    assert w.sched.profiles.means == {"late": 1.0, "later": 2.0}  # changes after the last


def test_no_wish_to_decide_means_no_decision_unasked():
    """A decision that leaves work queued but wants no decision of its own (nothing put off)
    is not followed by one until the shard is asked."""
    a, b = _arr("a"), _arr("b")
    w = _Worker()
    stepper = BatchStepper(w)
    got, wake = stepper.run(([1.0, 2.0], {}, _NO_CHANGES), [a, b, 0])
    assert got == [(0, [a])] and wake is False and list(w.sched.queue) == [b]


def test_a_class_due_before_an_instant_with_work_is_decided_first_with_its_means():
    """A put-off class due at 2.5 is decided there, with the means of that instant, before
    the work of the instant after it is applied; a due instant that has work too is decided
    once; completions are applied at their instant's time, cancelled (the router learns)."""

    a, b = _arr("a"), _arr("b")
    w = _Worker(queued=["q"], wants=2.5)
    stepper = BatchStepper(w)
    changes = _changes((1, "k", 1.0), (2, "k", 2.0), (3, "k", 3.0))
    got, _ = stepper.run(([1.0, 2.0, 2.5, 3.0], {}, changes), [a, 0, "x", b, 3])
    assert [(t, m, ops) for t, m, ops in w.log] == [
        (1.0, {}, [a]),
        (2.5, {"k": 2.0}, []),
        (3.0, {"k": 3.0}, ["x", b]),
    ]
    assert [k for k, _ in got] == [0, 2, 3]
    assert w.sched.completions == [("x", 3.0, Status.CANCELLED)]
    w = _Worker(queued=["q"], wants=2.0)
    BatchStepper(w).run(([1.0, 2.0], {}, _NO_CHANGES), [a, 0, b, 1])
    assert [t for t, _, _ in w.log] == [1.0, 2.0]  # due at 2.0 with work there: once


def test_decisions_after_the_last_op_read_the_means_of_their_instants():
    w = _Worker(queued=["q"], wants=True)
    changes = _changes((1, "k", 1.0), (2, "k", 2.0))
    got, wake = BatchStepper(w).run(([0.1, 0.2, 0.3], {}, changes), [_arr("a"), 0])
    assert [(t, m) for t, m, _ in w.log] == [(0.1, {}), (0.2, {"k": 1.0}), (0.3, {"k": 2.0})]
    assert [k for k, _ in got] == [0, 1, 2] and wake is True


def test_an_unknown_op_is_refused():

    w = _Worker(queued=["q"])
    with pytest.raises(ValueError, match="unknown op"):
        BatchStepper(w).run(([1.0], {}, _NO_CHANGES), [("rebind", "t"), 0])


def test_a_flat_arrival_is_queued_as_the_action_the_router_sent():
    """An arrival the router put in the op stream as a flat tuple (`wire.to_wire`) reaches the
    scheduler as that action, whole; one it left as an action (elastic), as itself."""
    plain = Action("p", {"cpu": 2}, duration=1.5, trajectory="t", task="k", kind="tool")
    elastic = Action("e", {"cpu": [1, 2]}, elasticity=Elasticity("cpu", 4.0, {1: 1, 2: 0.8}))
    w = _Worker()
    BatchStepper(w).run(([1.0], {}, _NO_CHANGES), [to_wire(plain), to_wire(elastic), 0])
    (_, _, applied), *_ = w.log
    got, same = applied
    assert type(got) is Action and same is elastic
    assert all(getattr(got, f) == getattr(plain, f) for f in ("id", "duration", "trajectory"))
    assert (got.task, got.kind, dict(got.mins)) == ("k", "tool", {"cpu": 2})


def test_mean_changes_keep_their_order_and_cross_as_columns():
    ch = MeanChanges()
    ch.append(1, "tool", 2.0)
    ch.append(3, "reward", 9.5)
    assert ch.triples() == [(1, "tool", 2.0), (3, "reward", 9.5)]
    at, kinds, means = pickle.loads(pickle.dumps(ch.wire()))
    assert (list(at), kinds, list(means)) == ([1, 3], ["tool", "reward"], [2.0, 9.5])
    assert (at.typecode, means.typecode) == ("q", "d")
