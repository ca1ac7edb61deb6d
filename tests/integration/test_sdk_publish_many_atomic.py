"""``publish_many`` publishes all of a batch or tells exactly what of it went out.

Real Kafka and Redis, no worker: published records wait in Kafka, where they are counted.

- What can be checked before sending is checked for the whole batch first: a request over
  ``kafka.max_request_bytes`` and a queue without room for the batch (``max_queue_size``,
  the batch's own requests counted) fail the call with nothing published. Both used to
  surface mid-batch, after the requests before them had gone out unreported: they ran,
  and a retry of the batch ran them twice.
- A Kafka failure after some sends (a record the broker refuses, a topic it cannot make)
  is raised once the records sent are settled, with ``details["published_ids"]``: those
  Kafka acknowledged, exactly the ones in the topic.
- The SDK's client-side errors are typed: Redis away in ``consume`` / ``ack`` is
  Unavailable; an ``infer_stream`` iterator of a closed ``SyncPlazaClient`` closes quietly.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from aiokafka.admin import NewTopic

from plaza.client import PlazaClient, SyncPlazaClient, make_request
from plaza.connections import kafka_admin
from plaza.errors import PayloadTooLarge, QueueFull, Unavailable
from plaza.settings import PlazaSettings
from plaza.stack import free_port
from tests.support import model_variant, running_worker

BOUNDED = """
name: "bounded" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { default_queue_policy { max_queue_size: 5 } }
"""


def row(i: float, width: int = 4) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, width), i, np.float32)}


async def queued(client: PlazaClient, model: str) -> int:
    """Records in ``model``'s topic that no worker has taken (measured now)."""
    client.producer.backlog._cache.clear()
    return await client.producer.backlog.lag(model, client.names.request_topic(model))


async def make_topic(settings: PlazaSettings, model: str, **configs: str) -> None:
    admin = kafka_admin(settings.kafka)
    await admin.start()
    try:
        topic = settings.names.request_topic(model)
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
    finally:
        await admin.close()


async def test_an_oversize_request_fails_the_batch_before_anything_is_sent(
    settings: PlazaSettings,
) -> None:
    async with PlazaClient(settings) as client:
        stream = client.results_stream("etl")
        batch = [make_request("identity", row(i), reply_stream=stream) for i in range(5)]
        big = make_request("identity", row(0, 3_000_000), reply_stream=stream)  # 12 MB
        batch.insert(3, big)
        with pytest.raises(PayloadTooLarge) as caught:
            await client.publish_many(batch)
        assert await queued(client, "identity") == 0
        assert big.id in caught.value.message


async def test_a_batch_the_queue_has_no_room_for_is_refused_whole(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """max_queue_size 5: a batch of 8 is refused with nothing sent (it used to be sent up
    to the limit, then refused without the ids that went); 5 fit, then none more."""
    repo = model_variant(tmp_path, "bounded", BOUNDED)
    kafka = settings.kafka.model_copy(update={"backlog_check_ttl_ms": 0})
    s = settings.model_copy(update={"repository": repo, "kafka": kafka})
    async with PlazaClient(s) as client:
        with pytest.raises(QueueFull) as caught:
            await client.publish_many(make_request("bounded", row(i)) for i in range(8))
        assert caught.value.details == {"depth": 0, "batch": 8, "max_queue_size": 5}
        assert await queued(client, "bounded") == 0
        ids = await client.publish_many(make_request("bounded", row(i)) for i in range(5))
        assert len(ids) == 5 and await queued(client, "bounded") == 5
        with pytest.raises(QueueFull):
            await client.publish_many([make_request("bounded", row(9))])
        assert await queued(client, "bounded") == 5


async def test_a_record_kafka_refuses_mid_batch_reports_what_was_published(
    settings: PlazaSettings,
) -> None:
    """The broker refuses a record over its topic's ``max.message.bytes`` (1 KiB here):
    the batch fails with the ids of the records acknowledged around it."""
    await make_topic(settings, "small", **{"max.message.bytes": "1024"})
    blind = settings.model_copy(update={"repository": Path("/nonexistent")})  # no checks
    async with PlazaClient(blind) as client:
        first = [make_request("fine", row(i)) for i in range(3)]
        refused = make_request("small", row(0, 1024))  # 4 KiB of inputs
        last = [make_request("fine", row(i)) for i in range(3, 5)]
        with pytest.raises(Unavailable) as caught:
            await client.publish_many([*first, refused, *last])
        published = caught.value.details["published_ids"]
        assert sorted(published) == sorted(r.id for r in first + last)
        assert await queued(client, "fine") == 5
        assert await queued(client, "small") == 0


async def test_a_send_that_fails_mid_batch_reports_what_was_published(
    settings: PlazaSettings,
) -> None:
    """Kafka refuses to make a topic whose name collides with another's ('.' and '_'):
    the send fails after three records went out; they are the ids reported."""
    await make_topic(settings, "clash_x")
    blind = settings.model_copy(update={"repository": Path("/nonexistent")})
    async with PlazaClient(blind) as client:
        first = [make_request("fine", row(i)) for i in range(3)]
        batch = [*first, make_request("clash.x", row(0)), make_request("fine", row(3))]
        with pytest.raises(Unavailable) as caught:
            await client.publish_many(batch)
        assert caught.value.details["published_ids"] == [r.id for r in first]
        assert await queued(client, "fine") == 3


async def test_redis_away_in_consume_and_ack_is_unavailable(settings: PlazaSettings) -> None:
    away = settings.redis.model_copy(update={"url": f"redis://127.0.0.1:{free_port()}/0"})
    async with PlazaClient(settings.model_copy(update={"redis": away})) as client:
        stream = client.results_stream("etl")
        with pytest.raises(Unavailable):
            async for _ in client.consume(stream, "g", "c1", idle_exit=True):
                pass
        with pytest.raises(Unavailable):
            await client.ack(stream, "g", b"0-1")


async def test_kafka_away_at_start_is_unavailable(settings: PlazaSettings) -> None:
    away = settings.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    s = settings.model_copy(update={"kafka": away})
    with pytest.raises(Unavailable) as caught:
        async with PlazaClient(s):
            pass
    assert away.bootstrap_servers in caught.value.message
    with pytest.raises(Unavailable):
        await asyncio.to_thread(SyncPlazaClient, s)


async def test_a_stream_closed_after_its_client_closes_quietly(
    settings: PlazaSettings,
) -> None:
    """An ``infer_stream`` iterator left open past ``close()`` used to raise Unavailable
    when closed (or print "Exception ignored" when collected)."""

    def stream_then_close() -> float:
        client = SyncPlazaClient(settings)
        responses = client.infer_stream("identity", row(2.0), timeout_s=60)
        first = next(responses)  # suspended at its yield: not finished
        client.close()
        responses.close()
        return float(first.output("OUTPUT0").to_numpy()[0, 0])

    async with running_worker(settings, "identity"):
        assert await asyncio.to_thread(stream_then_close) == 2.0
