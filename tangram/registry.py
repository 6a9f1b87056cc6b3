"""One registry mechanism for every family of plugins (policies, CPU and GPU backends, CLI
commands, workloads).

A `Registry` finds a name in three places, in this order:

1. objects registered at run time with `register` (a user's own policy, a test's);
2. the family's built-ins, a table of lazy `"module:attribute"` paths declared where the family
   lives, so a plain source checkout (no installed metadata, `PYTHONPATH=<tree>`) finds them;
3. the entry points of the family's group, for third-party plugins that an installed
   distribution declares (`[project.entry-points."<group>"]`).

Nothing is imported until a name is looked up, and then only the module that defines it. A path
is a string, never an import, so a table may name a module of the layer above (the CLI names
the evaluation's commands) without the lower layer importing it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named plugins of one family (see the module docstring)."""

    def __init__(self, family: str, builtins: Mapping[str, str], group: str | None = None):
        for name, path in builtins.items():
            if path.count(":") != 1:
                raise ValueError(f"{family} {name!r}: {path!r} is not 'module:attribute'")
        self.family = family
        self.group = group
        self._builtins = dict(builtins)
        self._loaded: dict[str, T] = {}

    # -- declaring -----------------------------------------------------------------------------
    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Add `obj` as `name` (`register(name, obj)`), or decorate (`@register(name)`)."""

        def add(o: T) -> T:
            known = self._loaded.get(name)
            if known is not None and known is not o:
                raise ValueError(f"{self.family} {name!r} registered twice")
            self._loaded[name] = o
            return o

        return add if obj is None else add(obj)

    # -- looking up ----------------------------------------------------------------------------
    def _installed(self) -> dict[str, str]:
        if self.group is None:
            return {}
        return {ep.name: ep.value for ep in entry_points(group=self.group)}

    def paths(self) -> dict[str, str]:
        """Every name not registered at run time, with its `module:attribute` path."""
        return {**self._installed(), **self._builtins}

    def names(self) -> list[str]:
        return sorted({*self._loaded, *self.paths()})

    def builtin_names(self) -> list[str]:
        return sorted(self._builtins)

    def module_of(self, name: str) -> str | None:
        """The module that defines `name` (without importing it where it is not loaded yet)."""
        if name in self._loaded:
            return getattr(self._loaded[name], "__module__", None)
        path = self.paths().get(name)
        return None if path is None else path.partition(":")[0]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._loaded or name in self.paths())

    def get(self, name: str) -> T | None:
        """The plugin called `name`, its module imported now (None: no such name). An
        `ImportError` of that module (a missing optional dependency) propagates."""
        if name in self._loaded:
            return self._loaded[name]
        path = self.paths().get(name) if isinstance(name, str) else None
        if path is None:
            return None
        module, _, attr = path.partition(":")
        obj = importlib.import_module(module.strip())
        for part in attr.split("[")[0].strip().split(".") if attr else ():
            obj = getattr(obj, part)
        return self._loaded.setdefault(name, obj)  # type: ignore[arg-type]
