"""Which Kafka offsets may be committed: only those below the oldest unfinished record, and
only of partitions this consumer owns.

Records finish out of order (priorities, sub-batches, error replies at intake), so each
partition keeps its outstanding offsets in arrival order; the committable offset is the
oldest outstanding one, or one past the last record seen when none is outstanding.

Only assigned partitions are tracked: a record taken in after its partition was revoked
(the rest of a fetch, while a dead-letter send was in flight) is refused by ``started``, so
a revoked partition never comes back into ``to_commit``. Kafka refuses a commit that names a
partition the consumer does not own, and refuses the whole commit with it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class _Partition:
    __slots__ = ("committed", "next", "outstanding")

    def __init__(self) -> None:
        self.outstanding: dict[int, None] = {}  # insertion order == offset order
        self.next: int | None = None
        """One past the newest record seen; None before the first."""
        self.committed = -1

    def committable(self) -> int | None:
        return next(iter(self.outstanding)) if self.outstanding else self.next


class OffsetTracker:
    """Outstanding offsets per owned partition (TopicPartitions, or anything hashable)."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, _Partition] = {}

    def assign(self, tps: Iterable[Hashable]) -> None:
        """Partitions now owned (a rebalance gave them); others already owned stay."""
        for tp in tps:
            self._parts.setdefault(tp, _Partition())

    def owns(self, tp: Hashable) -> bool:
        return tp in self._parts

    def started(self, tp: Hashable, offset: int) -> bool:
        """A record was taken in; outstanding until ``done``. False (nothing recorded) for a
        partition not owned: the record belongs to the partition's next owner."""
        part = self._parts.get(tp)
        if part is None:
            return False
        if part.next is None:
            part.committed = offset  # nothing below the first record is ours to commit
        part.outstanding[offset] = None
        part.next = offset + 1 if part.next is None else max(part.next, offset + 1)
        return True

    def done(self, tp: Hashable, offset: int) -> None:
        """The record's result is durable (ignored for a partition no longer owned)."""
        part = self._parts.get(tp)
        if part is not None:
            part.outstanding.pop(offset, None)

    def to_commit(self) -> dict[Hashable, int]:
        """Owned partitions whose committable offset moved since the last ``committed``."""
        moved: dict[Hashable, int] = {}
        for tp, part in self._parts.items():
            offset = part.committable()
            if offset is not None and offset > part.committed:
                moved[tp] = offset
        return moved

    def committed(self, offsets: dict[Hashable, int]) -> None:
        """Kafka took these commits."""
        for tp, offset in offsets.items():
            part = self._parts.get(tp)
            if part is not None:
                part.committed = max(part.committed, offset)

    def outstanding(self, tp: Hashable | None = None) -> int:
        """Records taken in and not yet done: of ``tp``, or of every owned partition."""
        if tp is None:
            return sum(len(p.outstanding) for p in self._parts.values())
        part = self._parts.get(tp)
        return len(part.outstanding) if part else 0

    def forget(self, tps: Iterable[Hashable]) -> None:
        """Partitions revoked: their outstanding records will be replayed by the next owner."""
        for tp in tps:
            self._parts.pop(tp, None)
