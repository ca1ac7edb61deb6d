"""Committing what is done, of the partitions still owned (worker and ensemble runner).

Kafka refuses a whole commit that names one partition the consumer no longer owns, so the
offsets of revoked partitions are left out; a commit that fails (a rebalance under way) is
only logged: the records are replayed, and a replay is idempotent (first write wins).
"""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from plaza.workers.offsets import OffsetTracker

log = logging.getLogger(__name__)


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
