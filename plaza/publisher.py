"""Publishing requests to Kafka: the one producer path of the gateway and the SDK."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer

from plaza.codec import encode_request
from plaza.connections import ensure_topics, kafka_producer
from plaza.contract import ENVELOPE_VERSION, InferRequest
from plaza.errors import PayloadTooLarge, Unavailable
from plaza.naming import (
    CONTENT_TYPE_MSGPACK,
    HEADER_CONTENT_TYPE,
    HEADER_CORRELATION_ID,
    HEADER_ENVELOPE_VERSION,
    Names,
)
from plaza.settings import KafkaSettings


def request_headers(req: InferRequest) -> list[tuple[str, bytes]]:
    return [
        (HEADER_ENVELOPE_VERSION, str(ENVELOPE_VERSION).encode()),
        (HEADER_CORRELATION_ID, req.id.encode()),
        (HEADER_CONTENT_TYPE, CONTENT_TYPE_MSGPACK),
    ]


class RequestPublisher:
    """Encodes requests once and sends them to their model's topic, keyed by correlation id."""

    def __init__(self, kafka: KafkaSettings, names: Names) -> None:
        self._kafka = kafka
        self._names = names
        self._producer: AIOKafkaProducer | None = None
        self._known_topics: set[str] = set()

    async def start(self) -> None:
        self._producer = kafka_producer(self._kafka)
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def topic_for(self, req: InferRequest) -> str:
        return self._names.request_topic(req.model, req.priority)

    async def publish(self, req: InferRequest) -> None:
        """Send and wait for the broker's acknowledgement (acks=all)."""
        timeout = self._kafka.request_timeout_ms / 1000
        try:
            fut = await asyncio.wait_for(self.send(req), timeout)
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise Unavailable(f"Kafka did not acknowledge the request within {timeout}s") from None
        except Unavailable:
            raise
        except Exception as exc:
            raise Unavailable(f"Kafka did not acknowledge the request: {exc}") from exc

    async def send(self, req: InferRequest) -> asyncio.Future[Any]:
        """Queue the record in the producer; returns the future of its acknowledgement.

        Many sends followed by awaiting their futures batch well (linger_ms).
        """
        if self._producer is None:
            raise Unavailable("publisher is not started")
        topic = self.topic_for(req)
        if topic not in self._known_topics:
            await ensure_topics(self._kafka, [topic])
            self._known_topics.add(topic)
        value = encode_request(req)
        if len(value) > self._kafka.max_request_bytes:
            raise PayloadTooLarge(
                f"request is {len(value)} bytes; the limit is {self._kafka.max_request_bytes}"
            )
        try:
            fut: asyncio.Future[Any] = await self._producer.send(
                topic, value=value, key=req.id.encode(), headers=request_headers(req)
            )
        except Exception as exc:
            raise Unavailable(f"Kafka did not take the request: {exc}") from exc
        return fut
