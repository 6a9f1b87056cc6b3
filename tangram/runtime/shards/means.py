"""The learned per-kind means the router mirrors to its node shards (package docstring).

Every completion the one learning rule learns from is an observation of its kind, numbered by a
version counter; each shard is at the version it was last sent, and is sent (with its next
tick) the mean of every kind observed since, so it decides with the durations the single
scheduler would have used.
"""

from __future__ import annotations

from tangram.profiles import DurationProfiles


class MeansMirror:
    """Which kinds' means each of `shards` node shards still lacks."""

    def __init__(self, profiles: DurationProfiles, shards: int) -> None:
        self.profiles = profiles
        self.kind_at: dict[str, int] = {}  # kind -> version of its last observation
        self.version = 0
        self.sent = [0] * shards  # the version each shard's means are at

    def observed(self, kind: str) -> None:
        """`kind` learned from a completion: every shard is sent its mean again."""
        self.version += 1
        self.kind_at[kind] = self.version

    def for_new(self, i: int) -> dict[str, float]:
        """The mean of every kind observed, for a shard (re)started as `i`: it is then current."""
        means = {k: m for k in self.kind_at if (m := self.profiles.mean(k)) is not None}
        self.sent[i] = self.version
        return means

    def since(self, i: int) -> dict[str, float]:
        """The means shard `i` has not been sent yet (its next tick carries them)."""
        sent = self.sent[i]
        self.sent[i] = self.version
        if sent == self.version:
            return {}
        return {
            k: m
            for k, v in self.kind_at.items()
            if v > sent and (m := self.profiles.mean(k)) is not None
        }
