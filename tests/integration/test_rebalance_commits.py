"""Commits keep working after partitions are revoked while a dead-letter send is in flight.

The intake takes a fetch record by record; a dead-letter send awaits Kafka, and a rebalance
can revoke partitions meanwhile. The rest of that fetch must not bring a revoked partition
back into the offset tracker: Kafka refuses a commit that names a partition the consumer
does not own, and refuses all of it, so every later commit of that worker would fail, its
lag would grow, and the next rebalance would replay answered requests.

The dead-letter send is held at the worker's producer (its only use) until a second worker
has joined and the partitions have moved; then every request must be answered and the group
must commit everything.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from plaza.client import make_request
from plaza.codec import encode_request
from plaza.connections import ensure_topics, kafka_producer
from plaza.settings import PlazaSettings
from plaza.workers.worker import Worker
from tests.support import group_offsets, wait_for, with_model

MODEL = "identity"
PER_PARTITION = 20
PARTITIONS = 4


async def committed_lag(settings: PlazaSettings, tps: list[TopicPartition]) -> int:
    """Records of ``tps`` that the model's worker group has not committed."""
    state = await group_offsets(settings, MODEL, tps)
    return sum(max(0, end - max(0, done)) for done, end in state.values())


async def publish(settings: PlazaSettings, start: int, garbage: bool) -> list[str]:
    """PER_PARTITION requests to each partition, with an unreadable record among them
    (not first: a worker's first fetch is one record, to learn their size)."""
    topic = settings.names.request_topic(MODEL)
    producer = kafka_producer(settings.kafka)
    await producer.start()
    ids: list[str] = []
    try:
        for partition in range(PARTITIONS):
            for i in range(start, start + PER_PARTITION):
                if garbage and i == start + 2:
                    await producer.send(topic, b"\xc1 not msgpack", partition=partition)
                n = i + partition * 1000
                req = make_request(MODEL, {"INPUT0": np.full((1, 2), n, np.float32)})
                ids.append(req.id)
                await producer.send(topic, encode_request(req), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()
    return ids


def hold_sends(worker: Worker) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the worker's dead-letter sends until released; (entered, release)."""
    entered, release = asyncio.Event(), asyncio.Event()
    send = worker.producer.send_and_wait

    async def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await send(*args, **kwargs)

    worker.producer.send_and_wait = held  # type: ignore[method-assign]
    return entered, release


@pytest.mark.timeout(120)
async def test_commits_go_on_after_a_revocation_during_a_dead_letter_send(
    settings: PlazaSettings, redis_client: Any
) -> None:
    four = settings.kafka.model_copy(update={"partitions": PARTITIONS})
    s = with_model(settings.model_copy(update={"kafka": four}), MODEL)
    tps = [TopicPartition(s.names.request_topic(MODEL), p) for p in range(PARTITIONS)]
    await ensure_topics(s.kafka, [tp.topic for tp in tps][:1])
    ids = await publish(s, 0, garbage=True)  # before the worker: one fetch holds both
    first = Worker(s.model_copy(update={"worker": s.worker.model_copy(update={"worker_id": "a"})}))
    second = Worker(s.model_copy(update={"worker": s.worker.model_copy(update={"worker_id": "b"})}))
    await first.start()
    entered, release = hold_sends(first)
    try:
        await wait_for(entered.is_set, 30, "a dead-letter send in flight")
        await second.start()  # joins: the group rebalances while the send is held
        await wait_for(
            lambda: bool(second.consumer.assignment()) and bool(first.consumer.assignment()),
            60,
            "the partitions split between the two workers",
        )
        release.set()
        ids += await publish(s, PER_PARTITION, garbage=False)
        keys = [s.names.result_key(rid) for rid in ids]

        async def answered() -> bool:
            return int(await redis_client.exists(*keys)) == len(keys)

        await wait_for(answered, 60, "every request answered")

        async def drained() -> bool:
            return await committed_lag(s, tps) == 0

        await wait_for(drained, 60, "the group to commit every record")
    finally:
        release.set()
        await second.stop()
        await first.stop()
    assert (
        first.metrics.records["dead_lettered"] + second.metrics.records["dead_lettered"]
        >= PARTITIONS
    )
