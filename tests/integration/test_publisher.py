"""The request publisher's first sends to a topic, on real Kafka.

A topic is made (if Kafka lacks it) before the first request goes to it. Sends that come
while it is being made wait for that one creation instead of starting their own admin
client each (64 clients starting at once made 64, each reading the cluster's metadata);
a failed creation fails the sends that waited for it, and the next send tries again.

The creation is the real ``plaza.connections.ensure_topics`` on the session's broker,
counted, and made to fail once in one test, by a wrapper around it. A gateway makes its
models' topics at start and tells its publisher, which then makes none of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import TopicPartition

from plaza import publisher as publisher_module
from plaza.client import make_request
from plaza.connections import ensure_topics, kafka_consumer
from plaza.errors import Unavailable
from plaza.gateway.service import GatewayService
from plaza.publisher import RequestPublisher
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, model_variant, wait_for

EnsureTopics = Callable[[Any, list[str]], Awaitable[None]]


def counted(calls: list[list[str]], before: EnsureTopics | None = None) -> EnsureTopics:
    """``ensure_topics``, recording each call's topics (and awaiting ``before`` first)."""

    async def ensure(kafka: Any, topics: list[str]) -> None:
        calls.append(list(topics))
        if before is not None:
            await before(kafka, topics)
        await ensure_topics(kafka, topics)

    return ensure


def requests(n: int) -> list[Any]:
    x = {"INPUT0": np.zeros((1, 3), np.float32)}
    return [make_request("identity", x) for _ in range(n)]


@asynccontextmanager
async def started(settings: PlazaSettings) -> AsyncIterator[RequestPublisher]:
    """A started publisher, stopped on the way out."""
    pub = RequestPublisher(settings.kafka, settings.names)
    await pub.start()
    try:
        yield pub
    finally:
        await pub.stop()


async def read_ids(settings: PlazaSettings, topic: str, n: int) -> set[str]:
    """The correlation ids of the first ``n`` records on ``topic``."""
    consumer = kafka_consumer(settings.kafka, f"{settings.kafka.topic_prefix}reader")
    await consumer.start()
    ids: set[str] = set()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(settings.kafka.partitions)])
        async with asyncio.timeout(30):
            while len(ids) < n:
                got = await consumer.getmany(timeout_ms=500)
                ids.update(r.key.decode() for rs in got.values() for r in rs if r.key)
    finally:
        await consumer.stop()
    return ids


async def test_a_burst_of_first_sends_makes_the_topic_once(
    settings: PlazaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(publisher_module, "ensure_topics", counted(calls))
    topic = settings.names.request_topic("identity")
    batch = requests(64)
    async with started(settings) as pub:
        await asyncio.gather(*(pub.publish(r, topic) for r in batch))
        await pub.publish(requests(1)[0], topic)  # known now: no creation at all
    assert calls == [[topic]]
    assert await read_ids(settings, topic, 64) >= {r.id for r in batch}


async def test_a_failed_creation_fails_its_waiters_and_the_next_send_tries_again(
    settings: PlazaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    gate = asyncio.Event()

    async def fail_first(kafka: Any, topics: list[str]) -> None:
        if len(calls) == 1:
            await gate.wait()  # until every first send waits for this creation
            raise ConnectionError("broker away")

    monkeypatch.setattr(publisher_module, "ensure_topics", counted(calls, fail_first))
    topic = settings.names.request_topic("identity")
    async with started(settings) as pub:
        first = [asyncio.create_task(pub.publish(r, topic)) for r in requests(8)]
        await wait_for(lambda: len(calls) == 1, what="the creation")  # the eight wait for it
        gate.set()
        outcomes = await asyncio.gather(*first, return_exceptions=True)
        later = requests(1)[0]
        await pub.publish(later, topic)
    assert all(isinstance(o, Unavailable) and "broker away" in str(o) for o in outcomes)
    assert calls == [[topic], [topic]]
    assert later.id in await read_ids(settings, topic, 1)


async def test_a_cancelled_first_send_leaves_the_creation_to_the_others(
    settings: PlazaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    gate = asyncio.Event()

    async def held(kafka: Any, topics: list[str]) -> None:
        await gate.wait()

    monkeypatch.setattr(publisher_module, "ensure_topics", counted(calls, held))
    topic = settings.names.request_topic("identity")
    cancelled, kept = requests(2)
    async with started(settings) as pub:
        gone = asyncio.create_task(pub.publish(cancelled, topic))
        stays = asyncio.create_task(pub.publish(kept, topic))
        await wait_for(lambda: len(calls) == 1, what="the creation")
        gone.cancel()
        await wait_for(gone.done, what="the cancelled send to end")
        gate.set()
        await stays
    assert gone.cancelled()
    assert calls == [[topic]]
    assert kept.id in await read_ids(settings, topic, 1)


async def test_a_gateways_first_request_to_its_model_makes_no_topic(
    settings: PlazaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway makes its models' topics at start and hands them to its publisher, so
    the first request to a model is published without a creation of its own."""
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    s = settings.model_copy(update={"repository": model_variant(tmp_path, "identity", config)})
    calls: list[list[str]] = []
    monkeypatch.setattr(publisher_module, "ensure_topics", counted(calls))
    request = requests(1)[0]
    service = GatewayService(s)
    await service.start()
    try:
        await service.submit(request)
    finally:
        await service.stop()
    assert calls == []
    assert request.id in await read_ids(s, s.names.request_topic("identity"), 1)
