"""Records that retention deleted before any worker read them are no backlog: the probe
behind ``max_queue_size`` counts from the partition's log start when the worker group's
committed offset is below it, so no QueueFull is raised for requests that are gone. Real
Kafka (``delete_records`` stands in for retention)."""

from __future__ import annotations

import numpy as np
import pytest
from aiokafka.admin import RecordsToDelete
from aiokafka.structs import TopicPartition

from plaza.client import make_request
from plaza.codec import encode_request
from plaza.connections import ensure_topics, kafka_admin, kafka_consumer, kafka_producer
from plaza.queueing import BacklogProbe
from plaza.settings import PlazaSettings
from tests.support import group_offsets, make_settings

MODEL = "identity"


async def commit_first_records(settings: PlazaSettings, tps: list[TopicPartition]) -> None:
    """Commit offset 1 on each of ``tps`` for the model's worker group."""
    consumer = kafka_consumer(settings.kafka, settings.names.consumer_group(MODEL))
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.commit({tp: 1 for tp in tps})
    finally:
        await consumer.stop()


@pytest.mark.timeout(60)
async def test_records_deleted_by_retention_are_not_a_backlog(
    kafka_bootstrap: str, redis_url: str, unique_id: str
) -> None:
    settings = make_settings(kafka_bootstrap, redis_url, unique_id)
    topic = settings.names.request_topic(MODEL)
    tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    await ensure_topics(settings.kafka, [topic])
    producer = kafka_producer(settings.kafka)
    await producer.start()
    try:
        for n in range(6):  # three on each partition
            req = make_request(MODEL, {"INPUT0": np.full((1, 2), n, np.float32)})
            await producer.send_and_wait(topic, encode_request(req), partition=n % 2)
    finally:
        await producer.stop()
    await commit_first_records(settings, tps)  # a worker group that stopped after one each
    probe = BacklogProbe(settings.kafka, settings.names)
    await probe.start()
    admin = kafka_admin(settings.kafka)
    await admin.start()
    try:
        assert await probe._measure(MODEL, topic) == 4
        ends = {tp: end for tp, (_, end) in (await group_offsets(settings, MODEL, tps)).items()}
        await admin.delete_records({tp: RecordsToDelete(end) for tp, end in ends.items()})
        assert await probe._measure(MODEL, topic) == 0
    finally:
        await admin.close()
        await probe.stop()
