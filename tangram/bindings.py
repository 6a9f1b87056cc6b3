"""Which node a trajectory's work runs on, per resource: one table that its owner writes and
everyone else reads.

A trajectory's environment lives on one node and all its CPU actions run there (paper 5.2).
The environment's owner, the CPU manager's `managers.cpu.environments.EnvironmentTable` (locally and
over Ray), is the only writer of that fact: `Bindings.attach(resource, owner)` makes the owner's
trajectory -> node mapping this table's answer for `resource`, so the scheduler, the policies
(`ClusterView.bindings`) and the invariant checks read the environments themselves, never a
copy synced by hand. Resources without an owner (the simulator's, an instance file's) are bound
with `bind`, held here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from tangram.errors import InvariantError

Key = tuple[str, str]  # (trajectory, resource)


class Bindings(Mapping[Key, str]):
    """`bindings[(trajectory, resource)]` -> node, a read-only mapping for its readers."""

    __slots__ = ("_own", "_of", "_owners")

    def __init__(self) -> None:
        self._own: dict[Key, str] = {}
        self._of: dict[str, set[str]] = {}  # trajectory -> resources bound here
        self._owners: dict[str, Mapping[str, str]] = {}  # resource -> trajectory -> node

    def attach(self, resource: str, owner: Mapping[str, str]) -> None:
        """From now on `owner` (trajectory -> node, kept by the environments' owner) answers
        for `resource`; what was bound here for it before is dropped."""
        self._owners[resource] = owner
        for key in [k for k in self._own if k[1] == resource]:
            self._drop(key)

    def owner(self, resource: str) -> Mapping[str, str] | None:
        return self._owners.get(resource)

    # -- the mapping ------------------------------------------------------------------------
    def __getitem__(self, key: Key) -> str:
        owner = self._owners.get(key[1])
        return owner[key[0]] if owner is not None else self._own[key]

    def get(self, key: Key, default: str | None = None) -> str | None:  # type: ignore[override]
        owner = self._owners.get(key[1])
        if owner is not None:
            return owner.get(key[0], default)
        return self._own.get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.get(key) is not None

    def __iter__(self) -> Iterator[Key]:
        yield from self._own
        for r, owner in self._owners.items():
            for t in owner:
                yield (t, r)

    def __len__(self) -> int:
        return len(self._own) + sum(len(o) for o in self._owners.values())

    # -- resources without an owner -----------------------------------------------------------
    def bind(self, trajectory: str, resource: str, node: str) -> None:
        """Bind where no owner answers; where one does, only check it agrees (the runtime
        announces a binding its owner already holds)."""
        owner = self._owners.get(resource)
        if owner is not None:
            if owner.get(trajectory) != node:
                raise InvariantError(
                    f"trajectory {trajectory}: bound to {node} on {resource}, "
                    f"but its environment is on {owner.get(trajectory)}"
                )
            return
        self._own[(trajectory, resource)] = node
        self._of.setdefault(trajectory, set()).add(resource)

    def unbind(self, trajectory: str) -> None:
        """Drop what was bound here for the trajectory (an owner drops its own)."""
        for r in self._of.pop(trajectory, ()):
            self._own.pop((trajectory, r), None)

    def _drop(self, key: Key) -> None:
        del self._own[key]
        rs = self._of.get(key[0])
        if rs is not None:
            rs.discard(key[1])
            if not rs:
                del self._of[key[0]]
