"""A dead letter that cannot be sent at once never stops the worker (real Kafka and Redis).

The worker dead-letters the records it cannot answer (unreadable ones, poison records) and
finishes them only once the dead letter is sent. A send that fails, whether for good (a
record too big to forward: the producer checks its size before compression) or for a while
(the dead-letter topic has no leader), used to escape the intake task and stop the worker;
the record was never committed, so every restart stopped on it again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from plaza.client import make_request
from plaza.codec import encode_request
from plaza.connections import ensure_topics, kafka_admin, kafka_producer
from plaza.naming import (
    HEADER_ERROR_CODE,
    HEADER_ORIGINAL_SIZE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)
from plaza.settings import PlazaSettings
from plaza.workers.host_services import HostServices
from plaza.workers.worker import Worker
from tests.support import serving_worker, still_serving, wait_for, with_model

MODEL = "identity"
BIG = 1 << 20


async def publish(settings: PlazaSettings, value: bytes, *, gzip: bool = False) -> None:
    """``value`` onto partition 0 of the model's topic (gzip: compressed on the wire)."""
    topic = settings.names.request_topic(MODEL)
    if gzip:
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka.bootstrap_servers,
            compression_type="gzip",
            max_request_size=8 << 20,
        )
    else:
        producer = kafka_producer(settings.kafka)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def answered_after(
    settings: PlazaSettings, client: redis.asyncio.Redis, watch: asyncio.Task[None]
) -> None:
    """A valid request published behind the bad record, on its partition, is answered."""
    req = make_request(MODEL, {"INPUT0": np.ones((1, 2), np.float32)}, correlation_id="after")
    await publish(settings, encode_request(req))
    key = settings.names.result_key(req.id)

    async def answered() -> bool:
        still_serving(watch)
        return bool(await client.exists(key))

    await wait_for(answered, 60, "the request behind the bad record answered")


async def dead_letters(settings: PlazaSettings, watch: asyncio.Task[None]) -> list[Any]:
    """The records of the model's dead-letter topic (waits for the first)."""
    consumer = AIOKafkaConsumer(
        settings.names.dead_letter_topic(MODEL),
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        group_id=None,
    )
    await consumer.start()
    records: list[Any] = []
    try:

        async def arrived() -> bool:
            still_serving(watch)
            got = await consumer.getmany(timeout_ms=500)
            records.extend(r for rs in got.values() for r in rs)
            return bool(records)

        await wait_for(arrived, 60, "a dead letter")
    finally:
        await consumer.stop()
    return records


async def committed(settings: PlazaSettings) -> int:
    """The model's consumer group's committed offset of partition 0 (-1: none)."""
    admin = kafka_admin(settings.kafka)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.names.consumer_group(MODEL))
    finally:
        await admin.close()
    meta = offsets.get(TopicPartition(settings.names.request_topic(MODEL), 0))
    return -1 if meta is None else meta.offset


@pytest.mark.timeout(180)
async def test_a_record_too_big_to_forward_is_dead_lettered_without_its_value(
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
) -> None:
    small = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"max_request_bytes": 64 * 1024})}
    )
    worker = Worker(with_model(small, MODEL))
    async with serving_worker(worker) as watch:
        # 1 MiB, unreadable and keyless: about 1 KiB gzip-compressed, so the topic takes it;
        # the dead-letter producer refuses it (its size is checked before compression)
        await publish(small, b"\xc1" * BIG, gzip=True)
        letters = await dead_letters(small, watch)
        await answered_after(small, redis_client, watch)

        async def offsets_committed() -> bool:
            still_serving(watch)
            return await committed(small) >= 2

        await wait_for(offsets_committed, 30, "the bad record's offset committed")
        still_serving(watch)
    [letter] = letters
    headers = dict(letter.headers)
    assert letter.value == b""
    assert headers[HEADER_ORIGINAL_SIZE] == str(BIG).encode()
    assert headers[HEADER_ERROR_CODE]  # why it was dead-lettered survives
    assert headers[HEADER_SOURCE_TOPIC] == small.names.request_topic(MODEL).encode()
    assert headers[HEADER_SOURCE_PARTITION] == b"0"
    assert headers[HEADER_SOURCE_OFFSET] == b"0"
    assert worker.metrics.records["dead_lettered"] == 1


@pytest.mark.timeout(180)
async def test_a_dead_letter_send_that_fails_for_a_while_is_retried(
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The host's dead-letter producer gives up on a send after 1.5 s (the consumer keeps the
    # usual timeouts).
    impatient = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"request_timeout_ms": 1500})}
    )
    services = HostServices.create(with_model(impatient, MODEL))
    worker = Worker(with_model(settings, MODEL), services)
    topic = settings.names.dead_letter_topic(MODEL)
    caplog.set_level(logging.WARNING, logger="plaza.retry")
    try:
        async with serving_worker(worker) as watch:
            # The dead-letter topic goes away (auto-creation is off): sends to it fail.
            admin = kafka_admin(settings.kafka)
            await admin.start()
            try:
                await admin.delete_topics([topic])

                async def deleted() -> bool:
                    return topic not in await admin.list_topics()

                await wait_for(deleted, 30, "the dead-letter topic deleted")
            finally:
                await admin.close()
            await publish(settings, b"\xc1unreadable")

            def retrying() -> bool:
                still_serving(watch)
                return any(
                    r.name == "plaza.retry" and "dead-lettering" in r.getMessage()
                    for r in caplog.records
                )

            await wait_for(retrying, 60, "a failed dead-letter send, retried")
            # The topic comes back (as a partition gets its leader back): the retry succeeds.
            await ensure_topics(settings.kafka, [topic])
            letters = await dead_letters(settings, watch)
            await answered_after(settings, redis_client, watch)
            still_serving(watch)
    finally:
        await services.close()
    assert [r.value for r in letters] == [b"\xc1unreadable"]
    assert dict(letters[0].headers)[HEADER_ERROR_CODE] == b"bad_envelope"
