"""The real services the other integration tests stand on: Kafka and Redis round trips."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from plaza.stack import KafkaCluster, RedisServer


async def test_kafka_produce_then_consume_one_record(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}roundtrip"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, b"hello", key=b"k1", headers=[("h", b"v")])
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"{topic_prefix}group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
        await consumer.commit()
    finally:
        await consumer.stop()
    assert (record.offset, record.key, record.value) == (sent.offset, b"k1", b"hello")
    assert list(record.headers) == [("h", b"v")]


async def test_kafka_broker_killed_and_restarted_keeps_records(
    kafka_cluster_factory: Callable[..., KafkaCluster],
) -> None:
    """SIGKILL a (private) broker and start it again: an acknowledged record is still there."""
    # The restarted node serves once the controller has let its killed self's registration
    # go: after broker.session.timeout.ms (6 s in plaza's clusters), cut here to 2 s.
    cluster = kafka_cluster_factory(nodes=1, config={"broker.session.timeout.ms": 2000})
    bootstrap = cluster.bootstrap_servers
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("survivor", num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait("survivor", b"still here")
    finally:
        await producer.stop()

    cluster.kill(0)
    assert not cluster.is_running(0)
    cluster.start_node(0)
    await cluster.wait_ready_async(120)

    consumer = AIOKafkaConsumer(
        "survivor", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
    finally:
        await consumer.stop()
    assert record.value == b"still here"


async def test_redis_set_get(redis_client: redis.asyncio.Redis, key_prefix: str) -> None:
    key = f"{key_prefix}greeting"
    await redis_client.set(key, b"hello", ex=60)
    assert await redis_client.get(key) == b"hello"


async def test_redis_restart_keeps_aof_data(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """A graceful restart and a SIGKILL (appendfsync always) both keep acknowledged writes.

    Runs its own Redis, so the session's server is never restarted under other tests.
    """
    server = redis_server_factory(appendfsync="always")
    await _set(server.url, "before-restart", b"1")
    server.restart()
    await server.wait_ready_async()
    assert await _get(server.url, "before-restart") == b"1"

    await _set(server.url, "before-kill", b"2")
    server.kill()
    server.start()
    await server.wait_ready_async()
    assert await _get(server.url, "before-restart") == b"1"
    assert await _get(server.url, "before-kill") == b"2"
    assert any((server.data_dir / "appendonlydir").iterdir())


async def _set(url: str, key: str, value: bytes) -> None:
    async with redis.asyncio.Redis.from_url(url) as client:
        await client.set(key, value)


async def _get(url: str, key: str) -> bytes | None:
    async with redis.asyncio.Redis.from_url(url) as client:
        value = await client.get(key)
        assert value is None or isinstance(value, bytes)
        return value
