"""Implementations of the allocation interface, resolved by name."""
