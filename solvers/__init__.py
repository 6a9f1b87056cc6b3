"""Implementations of the allocation interface, resolved by name."""

from solvers.registry import available, get_allocator, register

__all__ = ["available", "get_allocator", "register"]
