"""Committing what is done, of the partitions still owned (worker and ensemble runner),
and the rebalance listener both use.

Kafka refuses a whole commit that names one partition the consumer no longer owns, so the
offsets of revoked partitions are left out; a commit that fails (a rebalance under way) is
logged and its offsets kept for the caller's next try (the worker's committer tries again
after a pause); records whose commit never lands are replayed, and a replay is idempotent
(first write wins).

A partition whose topic was deleted (or that its topic no longer has) can never be committed
to: its records are gone, and a topic made again under the name starts at offset 0. aiokafka
retries such a commit (UnknownTopicOrPartitionError is retriable to it) for as long as the
topic is missing, and commits the old offsets to the new topic once it is made again. So the
offsets of partitions the consumer's metadata no longer holds are abandoned (a warning once a
topic) before a commit, and a commit is given ``COMMIT_WAIT_S``: past that it is dropped for
now, its offsets kept, and ``commit_owned`` says so, for the caller to try again after a pause.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
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


COMMIT_WAIT_S = 5.0
"""How long one commit may take. aiokafka retries a commit refused for a passing reason (the
coordinator moving, a timeout) within it, as it always has; past it the offsets stay for the
next try, and the request in flight may still land (committing twice is harmless)."""


async def commit_owned(consumer: AIOKafkaConsumer, offsets: OffsetTracker, who: str) -> bool:
    """Commit ``offsets``' committable offsets of the assigned partitions, and record them;
    those of partitions gone from Kafka are abandoned (``abandon_gone``). Whether nothing
    is left to retry: False after a failed or unfinished commit, whose offsets stay."""
    assigned = consumer.assignment()
    done = {tp: off for tp, off in offsets.to_commit().items() if tp in assigned}
    abandon_gone(consumer, offsets, done, who)
    if not done:
        return True
    try:
        async with asyncio.timeout(COMMIT_WAIT_S):
            await consumer.commit(done)
    except TimeoutError:
        log.warning(
            "%s: commit of %d partitions unfinished after %g s", who, len(done), COMMIT_WAIT_S
        )
        abandon_gone(consumer, offsets, done, who)  # a topic deleted meanwhile
        return False
    except KafkaError as exc:
        log.warning("%s: commit of %d partitions failed: %s", who, len(done), exc)
        return False
    offsets.committed(done)
    return True


def abandon_gone(
    consumer: AIOKafkaConsumer, offsets: OffsetTracker, pending: dict[Hashable, int], who: str
) -> None:
    """Take out of ``pending`` (and abandon in ``offsets``) the partitions that the
    consumer's metadata no longer holds: their topic was deleted, or made again with fewer
    partitions. Metadata refreshed after a fetch failed on them, or within
    ``kafka.metadata_max_age_ms``, tells. A partition only briefly missing (a topic being
    created) loses no work either: its records are replayed after a crash, as after any
    commit not made, and its next offsets are committed as usual."""
    gone = {tp: off for tp, off in pending.items() if not _in_metadata(consumer, tp)}
    if not gone:
        return
    told = {_topic(tp) for tp in offsets.abandoned}
    offsets.abandon(gone)
    for topic in sorted({_topic(tp) for tp in gone} - told):
        log.warning(
            "%s: topic %s (or some of its partitions) is gone from Kafka (deleted?): the "
            "offsets of its records are not committed (a topic made again starts at 0)",
            who,
            topic,
        )
    for tp in gone:
        del pending[tp]


def _in_metadata(consumer: AIOKafkaConsumer, tp: Hashable) -> bool:
    if not isinstance(tp, TopicPartition):
        return True
    partitions = consumer.partitions_for_topic(tp.topic)
    return partitions is not None and tp.partition in partitions


def _topic(tp: Hashable) -> str:
    return tp.topic if isinstance(tp, TopicPartition) else str(tp)
