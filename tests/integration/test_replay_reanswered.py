"""A retry under an answered request's id gets the stored answer, on real Kafka and Redis.

A producer may retry a request under the same correlation id (docs/protocol.md, "The
request record"). The worker finds it answered and does not run it again, but it sends the
stored answer to the reply stream the retry names, where the retry's caller waits: a
decoupled model's stored responses, then its final one. A record replayed as it was sent
(after a crash or a rebalance, sent before its answer was stored) and a request its caller
cancelled get no copy (``workers/answered.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_results, encode_request
from plaza.connections import kafka_producer
from plaza.contract import InferRequest, InferResult
from plaza.naming import STREAM_FIELD_RESULTS
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from tests.python_models import write_repository
from tests.support import make_settings, running_worker, wait_for

RETRY_TIMEOUT_S = 20.0
"""Generous: without the stored answer sent again, the retry waits all of it and raises."""


async def test_a_retry_under_the_same_id_gets_the_stored_answer(settings: PlazaSettings) -> None:
    await _retried(settings)


async def test_a_retry_gets_the_stored_answer_on_a_cluster(cluster_settings: PlazaSettings) -> None:
    """Each request's keys in their own slots: the look and the copy, one key a command."""
    await _retried(cluster_settings)


async def _retried(settings: PlazaSettings) -> None:
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    async with running_worker(settings, "identity") as worker, PlazaClient(settings) as client:
        first = await client.infer("identity", {"INPUT0": x}, correlation_id="retried")
        again = await client.infer(
            "identity", {"INPUT0": x}, correlation_id="retried", timeout_s=RETRY_TIMEOUT_S
        )
        assert again == first  # the stored answer, byte for byte (its timings, its worker)
        assert worker.metrics.executions() == 1  # the retry did not run
        assert worker.metrics.version("1").success.count == 1  # and counts nothing again
    np.testing.assert_array_equal(again.output("OUTPUT0").to_numpy(), x)


@pytest.fixture
def repeat_settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> PlazaSettings:
    root = write_repository(tmp_path / "repository", "repeat")
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


async def _responses(client: PlazaClient, timeout_s: float = 30.0) -> list[InferResult]:
    inputs = {"IN": np.array([[7, 8, 9]], np.int32)}
    stream = client.infer_stream("repeat", inputs, correlation_id="streamed", timeout_s=timeout_s)
    return [r async for r in stream]


async def test_a_retried_stream_gets_every_stored_response(
    repeat_settings: PlazaSettings,
) -> None:
    async with (
        running_worker(repeat_settings, "repeat") as worker,
        PlazaClient(repeat_settings) as client,
    ):
        first = await _responses(client)
        again = await _responses(client, RETRY_TIMEOUT_S)
        assert worker.metrics.executions() == 1
    assert [int(r.as_numpy()["OUT"][0, 0]) for r in first] == [7, 8, 9]
    assert again == first


async def _stream_results(r: aioredis.Redis, stream: str) -> list[InferResult]:
    entries: Any = await r.xrange(stream)
    return [res for _, fields in entries for res in decode_results(fields[STREAM_FIELD_RESULTS])]


async def test_a_replayed_record_and_a_cancelled_request_get_no_copy(
    settings: PlazaSettings,
) -> None:
    x = np.full((1, 2), 4, np.float32)
    async with running_worker(settings, "identity") as worker, PlazaClient(settings) as client:
        stream = client.results_stream("replays")

        def request(rid: str) -> InferRequest:
            return make_request("identity", {"INPUT0": x}, reply_stream=stream, correlation_id=rid)

        # The same record twice, as Kafka delivers it again after a crash: sent (sent_us, a
        # second back here) before its answer was stored, and on the stream with that answer.
        sent_us = time.time_ns() // 1000 - 1_000_000
        replayed = encode_request(request("replayed"), sent_us=sent_us)
        producer = kafka_producer(settings.kafka)
        await producer.start()
        try:
            topic = settings.names.request_topic("identity")
            await producer.send_and_wait(topic, replayed, key=b"replayed")
            await wait_for(lambda: worker.metrics.records["written"] == 1, what="its answer")
            await producer.send_and_wait(topic, replayed, key=b"replayed")
        finally:
            await producer.stop()
        cancelled = request("cancelled")
        assert await ResultStore(client._redis, settings.redis, settings.names).cancel(cancelled)
        await client.publish_many([cancelled])  # sent after its cancel: still no copy
        await wait_for(lambda: worker.metrics.records["skipped"] == 2, what="both skipped")
        # A fresh request answered after them: the worker's writes are in order, so a copy
        # sent for either would be on the stream before this answer.
        await client.publish_many([request("fresh")])
        await wait_for(lambda: worker.metrics.records["written"] == 2, what="the fresh answer")
        results = await _stream_results(client._redis, stream)
        assert [res.id for res in results] == ["replayed", "fresh"]
        assert worker.metrics.executions() == 2
