"""A request its caller cancelled before it ran is a failure of reason CANCELED (Triton's
``nv_inference_request_failure{reason="CANCELED"}`` and the statistics' ``fail``), on real
Kafka and Redis; a replay skipped the same way (already answered) counts nothing again."""

from __future__ import annotations

import numpy as np
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.codec import encode_request
from plaza.connections import kafka_producer
from plaza.contract import InferRequest
from plaza.metrics import REASON_CANCELED, render
from plaza.naming import METRIC_REQUEST_FAILURE, METRIC_REQUEST_SUCCESS
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.statistics import ModelStatistics
from plaza.workers.worker import Worker
from tests.metrics_support import samples, value
from tests.support import running_worker, wait_for


def _failures(worker: Worker, reason: str) -> float | None:
    scraped = samples(render(worker.metrics.registry).decode())
    return value(scraped, METRIC_REQUEST_FAILURE, model="identity", version="1", reason=reason)


def _successes(worker: Worker) -> float | None:
    scraped = samples(render(worker.metrics.registry).decode())
    return value(scraped, METRIC_REQUEST_SUCCESS, model="identity", version="1")


def _requests(stream: str, *ids: str) -> list[InferRequest]:
    x = np.full((1, 2), 2, np.float32)
    return [
        make_request("identity", {"INPUT0": x}, reply_stream=stream, correlation_id=rid)
        for rid in ids
    ]


async def test_a_request_cancelled_before_intake_is_a_canceled_failure(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    async with PlazaClient(settings) as client:
        store = ResultStore(client._redis, settings.redis, settings.names)
        cancelled, kept = _requests(client.results_stream("c"), "cancelled-id", "kept-id")
        assert await store.cancel(cancelled)
        await client.publish_many([cancelled, kept])
        async with running_worker(settings, "identity") as worker:
            await wait_for(lambda: worker.metrics.records["skipped"] == 1, what="the skip")
            await wait_for(lambda: worker.metrics.records["written"] == 1, what="kept's answer")
            assert _failures(worker, REASON_CANCELED) == 1
            assert _successes(worker) == 1
            # a replay of the answered request is skipped too, and counts nothing again
            (again,) = _requests(client.results_stream("c"), "kept-id")
            await client.publish_many([again])
            await wait_for(lambda: worker.metrics.records["skipped"] == 2, what="the replay")
            assert _failures(worker, REASON_CANCELED) == 1
            assert _successes(worker) == 1
            assert worker.metrics.executions() == 1
    # the statistics extension: the worker's last flush is in the version's hash
    key = settings.names.model_stats_key("identity", "1")
    stats = ModelStatistics.from_fields(await redis_client.hgetall(key))
    assert stats.fail.count == 1
    assert stats.failures == {REASON_CANCELED: 1}
    assert stats.success.count == 1


async def test_a_cancelled_request_found_at_launch_is_a_canceled_failure(
    settings: PlazaSettings,
) -> None:
    """A record keyed by something other than its request's id is not looked up at intake:
    the launch-time look finds its caller's cancel."""
    async with PlazaClient(settings) as client:
        store = ResultStore(client._redis, settings.redis, settings.names)
        cancelled, kept = _requests(client.results_stream("raw"), "raw-cancelled", "raw-kept")
        assert await store.cancel(cancelled)
        async with running_worker(settings, "identity") as worker:  # it makes the topic
            producer = kafka_producer(settings.kafka)
            await producer.start()
            try:
                topic = settings.names.request_topic("identity")
                for req, key in ((cancelled, b"another-id"), (kept, None)):
                    await producer.send_and_wait(topic, encode_request(req), key=key)
            finally:
                await producer.stop()
            await wait_for(lambda: worker.metrics.records["skipped"] == 1, what="the skip")
            await wait_for(lambda: worker.metrics.records["written"] == 1, what="kept's answer")
            assert _failures(worker, REASON_CANCELED) == 1
            assert _successes(worker) == 1
            assert worker.metrics.version("1").fail.count == 1
