"""Committing what is done, of the partitions still owned (worker and ensemble runner),
and the rebalance listener both use.

Kafka refuses a whole commit that names one partition the consumer no longer owns, so the
offsets of revoked partitions are left out; a commit that fails (a rebalance under way) is
only logged: the records are replayed, and a replay is idempotent (first write wins).
"""

from __future__ import annotations

import logging
from typing import Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from plaza.workers.offsets import OffsetTracker

log = logging.getLogger(__name__)


class PartitionOwner(Protocol):
    """What a rebalance tells: a worker or an ensemble runner."""

    id: str
    offsets: OffsetTracker

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish and commit what it can of ``revoked`` before they go to another member."""


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The consumer's rebalance listener of a :class:`PartitionOwner`."""

    def __init__(self, owner: PartitionOwner) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._owner.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._owner.offsets.assign(assigned)
        log.info(
            "%s: assigned %s", self._owner.id, sorted(f"{t.topic}:{t.partition}" for t in assigned)
        )


async def commit_owned(consumer: AIOKafkaConsumer, offsets: OffsetTracker, who: str) -> None:
    """Commit ``offsets``' committable offsets of the assigned partitions, and record them."""
    assigned = consumer.assignment()
    done = {tp: off for tp, off in offsets.to_commit().items() if tp in assigned}
    if not done:
        return
    try:
        await consumer.commit(done)
    except KafkaError as exc:
        log.warning("%s: commit of %d partitions failed: %s", who, len(done), exc)
        return
    offsets.committed(done)
