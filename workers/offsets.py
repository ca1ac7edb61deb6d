"""Which Kafka offsets may be committed: only those below the oldest unfinished record, and
only of partitions this consumer owns.

Records finish out of order (priorities, sub-batches, error replies at intake), so each
partition keeps its outstanding offsets in arrival order; the committable offset is the
oldest outstanding one, or, when none is outstanding, one past the last record seen or the
consumer's position after the last fetch taken in entirely (``fetched_to``), whichever is
further. The position counts: with ``read_committed`` the consumer hands over no record for
a transaction's commit or abort marker, nor for an aborted transaction's records, so a
partition whose tail is such offsets would otherwise never be committed to its end (a
backlog that ``max_queue_size`` counts for good).

Only assigned partitions are tracked: a record taken in after its partition was revoked
(the rest of a fetch, while a dead-letter send was in flight) is refused by ``started``, so
a revoked partition never comes back into ``to_commit``. Kafka refuses a commit that names a
partition the consumer does not own, and refuses the whole commit with it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class _Partition:
    __slots__ = ("committed", "fetched", "next", "outstanding")

    def __init__(self) -> None:
        self.outstanding: dict[int, None] = {}  # insertion order == offset order
        self.next: int | None = None
        """One past the newest record seen; None before the first."""
        self.fetched: int | None = None
        """The consumer's position after the last fetch taken in entirely: every record
        below it was seen; None before the first."""
        self.committed = -1

    def committable(self) -> int | None:
        if self.outstanding:
            return next(iter(self.outstanding))
        if self.fetched is None or (self.next is not None and self.next > self.fetched):
            return self.next
        return self.fetched


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
        if part.next is None and part.fetched is None:
            part.committed = offset  # nothing below the first record is ours to commit
        part.outstanding[offset] = None
        part.next = offset + 1 if part.next is None else max(part.next, offset + 1)
        return True

    def done(self, tp: Hashable, offset: int) -> None:
        """The record's result is durable (ignored for a partition no longer owned)."""
        part = self._parts.get(tp)
        if part is not None:
            part.outstanding.pop(offset, None)

    def fetched_to(self, tp: Hashable, position: int) -> bool:
        """A fetch was taken in entirely (each of its records ``started``), after which the
        consumer's position in ``tp`` is ``position``: once no record is outstanding, it may
        be committed. Call it only between fetches: the position counts every record the
        consumer handed over. Whether ``to_commit`` now holds more for ``tp``."""
        part = self._parts.get(tp)
        if part is None:
            return False
        part.fetched = position
        offset = part.committable()
        return offset is not None and offset > part.committed

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
