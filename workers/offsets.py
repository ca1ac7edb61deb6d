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
partition the consumer does not own, and refuses the whole commit with it. A partition
whose topic was deleted is never committed to either: its offsets are ``abandon``-ed
(``plaza.workers.commit``).

The worker and the ensemble runner consume alike, with two functions here: ``follow_positions``
(what they call after each fetch taken in) and ``read_ahead`` (their consumer's fetch limits).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

from aiokafka.errors import IllegalStateError, KafkaError

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    from plaza.settings import KafkaSettings

log = logging.getLogger(__name__)

RECORD_OVERHEAD = 64 * 1024
"""What a record's batch may add to its ``kafka.max_request_bytes`` (as the topics' own
``max.message.bytes`` allows, ``plaza.connections``)."""


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
        self.abandoned: dict[Hashable, int] = {}
        """Per partition, the last offset ``abandon`` gave up (its topic or partition is
        gone), until the partition is assigned again: at most one entry a partition."""
        self.abandoned_count = 0
        """How many partitions' commits ``abandon`` gave up, ever."""

    def assign(self, tps: Iterable[Hashable]) -> None:
        """Partitions now owned (a rebalance gave them); others already owned stay."""
        for tp in tps:
            self._parts.setdefault(tp, _Partition())
            self.abandoned.pop(tp, None)

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

    def abandon(self, offsets: dict[Hashable, int]) -> None:
        """Kafka can never take these commits (the partition's topic was deleted, or the
        partition no longer exists): ``to_commit`` stops offering them, as if committed. Its
        outstanding records stay tracked; a later offset of the partition is offered again."""
        self.committed(offsets)
        self.abandoned.update(offsets)
        self.abandoned_count += len(offsets)

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


async def follow_positions(
    consumer: AIOKafkaConsumer,
    offsets: OffsetTracker,
    positions: dict[TopicPartition, int] | None = None,
    leaving: Collection[TopicPartition] = (),
) -> bool:
    """After a fetch is taken in entirely: each owned partition's position, which moves
    past what the consumer hands over no record for (transaction markers, aborted
    transactions), bounds the commit once its records are done (``fetched_to``); each is
    also written to ``positions`` as it is read. Only partitions fetched from in this
    assignment (a highwater known) are asked: another's position may still be on its way,
    which would hold the intake up. Partitions ``leaving`` (being revoked, the rest of
    their fetch refused for their next owner) are not: their position is past records
    nobody ran. Whether ``offsets.to_commit`` now holds more."""
    tps = [
        tp
        for tp in consumer.assignment()
        if offsets.owns(tp) and consumer.highwater(tp) is not None and tp not in leaving
    ]
    moved = False
    for tp in tps:
        try:
            position = await consumer.position(tp)
        except IllegalStateError:  # revoked meanwhile
            continue
        if tp in leaving:  # its revocation began while the position was asked
            continue
        if positions is not None:
            positions[tp] = position
        moved = offsets.fetched_to(tp, position) or moved
    return moved


async def read_ahead(
    producer: AIOKafkaProducer,
    topics: Sequence[str],
    kafka: KafkaSettings,
    budget: int,
    who: str,
) -> dict[str, int]:
    """A group member's fetch limits (``kafka_consumer``'s overrides), its read-ahead kept
    to a quarter of the byte ``budget``: the fetcher buffers up to
    ``max_partition_fetch_bytes`` for each partition it owns, and the member may own every
    partition of ``topics`` (counted now through ``producer``'s metadata: partitions added
    later are not, and aiokafka cannot change the limit of a running consumer). The limit
    never goes below the largest record taken (plus its batch's overhead), so a record of
    any accepted size can always be fetched; with many partitions that floor, not the
    quarter, bounds the read-ahead (docs/guarantees.md). ``who`` names the member in logs."""
    quarter = budget // 4
    partitions = await _partition_count(producer, topics, kafka.partitions, who)
    share = min(kafka.max_request_bytes * 2, quarter // partitions)
    per_partition = max(kafka.max_request_bytes + RECORD_OVERHEAD, share)
    return {
        "max_partition_fetch_bytes": per_partition,
        "fetch_max_bytes": max(per_partition, min(50 << 20, quarter)),
    }


async def _partition_count(
    producer: AIOKafkaProducer, topics: Sequence[str], each: int, who: str
) -> int:
    """Partitions of ``topics`` together (their metadata; ``each``, what Plaza creates them
    with, where Kafka does not tell)."""
    total = 0
    for topic in topics:
        try:
            total += len(await producer.partitions_for(topic))
        except KafkaError as exc:
            log.warning("%s: partitions of %s unknown (%s)", who, topic, exc)
            total += each
    return max(1, total)
