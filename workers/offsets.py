"""Which Kafka offsets may be committed: only those below the oldest unfinished record.

Records finish out of order (priorities, sub-batches, error replies at intake), so each
partition keeps its outstanding offsets in arrival order; the committable offset is the
oldest outstanding one, or one past the last record seen when none is outstanding.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class _Partition:
    __slots__ = ("committed", "next", "outstanding")

    def __init__(self, first: int) -> None:
        self.outstanding: dict[int, None] = {}  # insertion order == offset order
        self.next = first
        self.committed = first

    def committable(self) -> int:
        return next(iter(self.outstanding)) if self.outstanding else self.next


class OffsetTracker:
    """Outstanding offsets per partition (keys are TopicPartitions, or anything hashable)."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, _Partition] = {}

    def started(self, tp: Hashable, offset: int) -> None:
        """A record was taken in; it is outstanding until ``done``."""
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition(offset)
        part.outstanding[offset] = None
        part.next = max(part.next, offset + 1)

    def done(self, tp: Hashable, offset: int) -> None:
        """The record's result is durable (ignored for a partition no longer owned)."""
        part = self._parts.get(tp)
        if part is not None:
            part.outstanding.pop(offset, None)

    def to_commit(self) -> dict[Hashable, int]:
        """Partitions whose committable offset moved since the last ``committed``."""
        return {
            tp: part.committable()
            for tp, part in self._parts.items()
            if part.committable() > part.committed
        }

    def committed(self, offsets: dict[Hashable, int]) -> None:
        for tp, offset in offsets.items():
            part = self._parts.get(tp)
            if part is not None:
                part.committed = max(part.committed, offset)

    def outstanding(self, tp: Hashable | None = None) -> int:
        if tp is None:
            return sum(len(p.outstanding) for p in self._parts.values())
        part = self._parts.get(tp)
        return len(part.outstanding) if part else 0

    def forget(self, tps: Iterable[Hashable]) -> None:
        """Partitions revoked: their outstanding records will be replayed by the next owner."""
        for tp in tps:
            self._parts.pop(tp, None)
