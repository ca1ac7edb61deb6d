"""Moving a record to its model's dead-letter topic, as it came, with why in its headers.

The worker (a record admission refused, or a poison record) and the ensemble runner (an
envelope it cannot read) both use it, so the headers of docs/protocol.md are written once.

A dead letter is never given up on: a failed send (no leader for the dead-letter partition,
a timeout) is retried until it goes through, or until the caller stops (the record is then
not finished, so the partition's next owner takes it again). A record too big to forward
(its value is checked before compression, against ``kafka.max_request_bytes`` plus the
producer's headroom, and by the broker) goes without its value: its headers say why it was
dead-lettered, where it came from, and how big the value was (``HEADER_ORIGINAL_SIZE``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

from plaza.errors import PlazaError
from plaza.naming import (
    HEADER_ERROR_CODE,
    HEADER_ERROR_MESSAGE,
    HEADER_ORIGINAL_SIZE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)
from plaza.retry import until_done

log = logging.getLogger(__name__)

TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
"""The producer's (before sending) or the broker's refusal of a record for its size."""
Headers = list[tuple[str, bytes]]


async def dead_letter(
    producer: AIOKafkaProducer,
    topic: str,
    tp: TopicPartition,
    record: Any,
    error: PlazaError,
    who: str,
    stop: asyncio.Event | None = None,
) -> None:
    """Send ``record`` (taken from ``tp``) to ``topic``, its own headers kept and the
    error and source added; ``who`` (a worker id) names the sender in the log line.

    A failed send is tried again with backoff until it goes through; once ``stop`` is set a
    failure is raised instead (``plaza.retry.until_done``). A record too big to send goes
    with an empty value and ``HEADER_ORIGINAL_SIZE``."""
    headers: Headers = [
        (HEADER_ERROR_CODE, error.code.encode()),
        (HEADER_ERROR_MESSAGE, error.message.encode()[:1024]),
        (HEADER_SOURCE_TOPIC, tp.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(tp.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
    ]
    where = f"{tp.topic}:{tp.partition}:{record.offset}"
    log.warning("%s: dead-lettering %s: %s", who, where, error.message)
    await until_done(
        lambda: _send(producer, topic, record, headers, f"{who}: {where}"),
        f"{who}: dead-lettering {where}",
        stop,
    )


async def _send(
    producer: AIOKafkaProducer, topic: str, record: Any, headers: Headers, what: str
) -> None:
    """One try: the record as it came; if it is too big, without its value; if that is
    still too big (a huge key or headers of its own), with the error headers alone.
    ``what`` (the sender and the record's source) names the record in the log line."""
    own: Headers = list(record.headers or ())
    size = len(record.value or b"")
    try:
        await producer.send_and_wait(
            topic, value=record.value, key=record.key, headers=own + headers
        )
        return
    except TOO_LARGE as exc:
        log.warning(
            "%s (%d bytes) is too big to forward (%s): sent without its value", what, size, exc
        )
    headers = [*headers, (HEADER_ORIGINAL_SIZE, str(size).encode())]
    try:
        await producer.send_and_wait(topic, value=b"", key=record.key, headers=own + headers)
    except TOO_LARGE:
        await producer.send_and_wait(topic, value=b"", key=None, headers=headers)
