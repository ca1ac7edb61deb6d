"""A worker's committed offsets reach the end of what it has finished, and its consumer
follows the topics it serves.

- Dead letters at a partition's tail are committed while the worker runs: else the
  gateway's backlog (``max_queue_size``) counts them for good, and a worker killed -9
  dead-letters them again.
- Offsets the consumer hands over no record for (a transaction's commit or abort marker,
  an aborted transaction's records; ``read_committed``) are committed too, once every record
  before them is answered: else any transactional producer leaves a backlog for good.
- Partitions added to a request topic are published to and consumed within
  ``kafka.metadata_max_age_ms``, not aiokafka's five minutes.
- The fetcher's read-ahead over every partition stays within a quarter of the byte budget,
  never below one record of the largest accepted size.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import NewPartitions
from aiokafka.structs import TopicPartition

from plaza.client import make_request
from plaza.codec import encode_request
from plaza.connections import ensure_topics, kafka_admin, kafka_producer
from plaza.queueing import BacklogProbe
from plaza.settings import PlazaSettings
from plaza.workers.offsets import OffsetTracker
from tests.support import group_offsets, make_settings, running_worker, wait_for

MODEL = "identity"
UNREADABLE = b"\xc1 not msgpack"


def request_record(n: int) -> tuple[str, bytes]:
    req = make_request(MODEL, {"INPUT0": np.full((1, 2), n, np.float32)})
    return req.id, encode_request(req)


async def committed_and_ends(settings: PlazaSettings, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of ``topic`` (``kafka.partitions`` of them): the worker group's
    committed offset (-1: none) and the partition's end offset."""
    tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    state = await group_offsets(settings, MODEL, tps)
    return {tp.partition: offsets for tp, offsets in state.items()}


async def all_committed(settings: PlazaSettings, topic: str) -> bool:
    state = await committed_and_ends(settings, topic)
    return all(done == end for done, end in state.values())


@contextlib.asynccontextmanager
async def backlog_probe(settings: PlazaSettings) -> AsyncIterator[BacklogProbe]:
    """The gateway's measure of a model's queue (what ``max_queue_size`` is checked on)."""
    probe = BacklogProbe(settings.kafka, settings.names)
    await probe.start()
    try:
        yield probe
    finally:
        await probe.stop()


async def test_dead_letters_at_a_partition_tail_are_committed_while_the_worker_runs(
    kafka_bootstrap: str, redis_url: str, unique_id: str
) -> None:
    settings = make_settings(
        kafka_bootstrap, redis_url, unique_id, kafka={"backlog_check_ttl_ms": 0}
    )
    topic = settings.names.request_topic(MODEL)
    async with running_worker(settings, MODEL) as worker, backlog_probe(settings) as probe:
        producer = kafka_producer(settings.kafka)
        await producer.start()
        try:
            for _ in range(3):
                await producer.send_and_wait(topic, UNREADABLE, partition=0)
        finally:
            await producer.stop()
        await wait_for(lambda: worker.metrics.records["dead_lettered"] == 3, 30, "3 dead letters")
        # nothing is published after them: only finishing them can move the commit
        await wait_for(lambda: all_committed(settings, topic), 30, "the dead letters' commit")
        assert await probe.lag(MODEL, topic) == 0  # the gateway sees an empty queue
    assert (await committed_and_ends(settings, topic))[0] == (3, 3)


async def test_transaction_markers_and_aborted_records_are_committed(
    kafka_bootstrap: str, redis_url: str, unique_id: str
) -> None:
    """A transactional producer: a committed transaction of 3 requests on partition 0 (its
    commit marker at offset 3), an aborted one of 5 on partition 1 (5 records never handed
    over, and the abort marker): both partitions are committed to their ends."""
    settings = make_settings(kafka_bootstrap, redis_url, unique_id)
    topic = settings.names.request_topic(MODEL)
    async with running_worker(settings, MODEL) as worker:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"{unique_id}-{uuid.uuid4().hex}"
        )
        await producer.start()
        ids: list[str] = []
        try:
            async with producer.transaction():
                for n in range(3):
                    rid, value = request_record(n)
                    ids.append(rid)
                    await producer.send(topic, value, key=rid.encode(), partition=0)
            await producer.begin_transaction()
            for n in range(5):
                rid, value = request_record(100 + n)
                await producer.send(topic, value, key=rid.encode(), partition=1)
            await producer.abort_transaction()
        finally:
            await producer.stop()

        async def answered() -> bool:
            found = [await worker.redis.exists(settings.names.result_key(r)) for r in ids]
            return all(found)

        await wait_for(answered, 30, "the committed transaction's answers")
        await wait_for(lambda: all_committed(settings, topic), 30, "commits to the ends")
        assert await committed_and_ends(settings, topic) == {0: (4, 4), 1: (6, 6)}
        assert worker._lag() == 0  # markers and aborted records are not a backlog
    assert await committed_and_ends(settings, topic) == {0: (4, 4), 1: (6, 6)}


async def test_added_partitions_are_served_within_the_metadata_age(
    kafka_bootstrap: str, redis_url: str, unique_id: str
) -> None:
    """A producer started before the partitions were added publishes to them, and the
    worker's group takes them in, within ``kafka.metadata_max_age_ms``."""
    settings = make_settings(
        kafka_bootstrap, redis_url, unique_id, kafka={"metadata_max_age_ms": 1000}
    )
    topic = settings.names.request_topic(MODEL)
    async with running_worker(settings, MODEL) as worker:
        await wait_for(lambda: len(worker.consumer.assignment()) == 2, 30, "2 partitions")
        producer = kafka_producer(settings.kafka)
        await producer.start()
        try:
            assert len(await producer.partitions_for(topic)) == 2  # known before the change
            admin = kafka_admin(settings.kafka)
            await admin.start()
            try:
                await admin.create_partitions({topic: NewPartitions(total_count=4)})
            finally:
                await admin.close()

            async def four() -> bool:
                return len(await producer.partitions_for(topic)) == 4

            await wait_for(four, 30, "the producer to see 4 partitions")
            rid, value = request_record(7)
            await producer.send_and_wait(topic, value, key=rid.encode(), partition=3)
        finally:
            await producer.stop()

        async def answered() -> bool:
            return bool(await worker.redis.exists(settings.names.result_key(rid)))

        await wait_for(answered, 30, "the answer from partition 3")
        assert TopicPartition(topic, 3) in worker.consumer.assignment()


@pytest.mark.parametrize(
    "max_request_bytes",
    [
        256 * 1024,  # a quarter of the budget over 8 partitions holds such records
        8 << 20,  # it does not: one record of the largest size per partition
    ],
)
async def test_read_ahead_is_a_quarter_of_the_budget_over_all_partitions(
    kafka_bootstrap: str, redis_url: str, unique_id: str, max_request_bytes: int
) -> None:
    budget = 16 << 20
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        kafka={"max_request_bytes": max_request_bytes},
        worker={"max_pending_bytes": budget},
    )
    kafka = settings.kafka.model_copy(update={"partitions": 8})
    settings = settings.model_copy(update={"kafka": kafka})
    await ensure_topics(settings.kafka, [settings.names.request_topic(MODEL)])
    async with running_worker(settings, MODEL) as worker:
        # what aiokafka buffers per partition (no public getter)
        limit = worker.consumer._fetcher._max_partition_fetch_bytes
    largest = max_request_bytes + 64 * 1024  # a record and its batch's overhead
    assert limit >= largest  # every accepted record can be fetched
    assert limit * 8 <= budget // 4 or limit == largest  # else the floor, and no more


def test_a_fetched_position_is_committed_only_once_every_record_before_it_is_done() -> None:
    t = OffsetTracker()
    t.assign(["p"])
    assert t.started("p", 0) and t.started("p", 1)
    assert not t.fetched_to("p", 3)  # offset 2: a marker; 0 and 1 still outstanding
    t.done("p", 1)
    assert t.to_commit() == {}
    t.done("p", 0)
    assert t.to_commit() == {"p": 3}
    t.committed({"p": 3})
    assert t.started("p", 5)  # a later fetch: 3 and 4 were markers too
    t.done("p", 5)
    assert t.to_commit() == {"p": 6}  # the record beyond the last position counts
