"""Moving a record to its model's dead-letter topic, as it came, with why in its headers.

The worker (a record admission refused, or a poison record) and the ensemble runner (an
envelope it cannot read) both use it, so the headers of docs/protocol.md are written once.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from plaza.errors import PlazaError
from plaza.naming import (
    HEADER_ERROR_CODE,
    HEADER_ERROR_MESSAGE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)

log = logging.getLogger(__name__)


async def dead_letter(
    producer: AIOKafkaProducer,
    topic: str,
    tp: TopicPartition,
    record: Any,
    error: PlazaError,
    who: str,
) -> None:
    """Send ``record`` (taken from ``tp``) to ``topic``, its own headers kept and the
    error and source added; ``who`` (a worker id) names the sender in the log line."""
    headers = [
        *(record.headers or ()),
        (HEADER_ERROR_CODE, error.code.encode()),
        (HEADER_ERROR_MESSAGE, error.message.encode()[:1024]),
        (HEADER_SOURCE_TOPIC, tp.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(tp.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
    ]
    log.warning(
        "%s: dead-lettering %s:%d:%d: %s", who, tp.topic, tp.partition, record.offset, error.message
    )
    await producer.send_and_wait(topic, value=record.value, key=record.key, headers=headers)
