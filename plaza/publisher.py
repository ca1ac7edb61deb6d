"""Publishing requests to Kafka: records, headers and acknowledgements (``plaza.producer``
decides what goes to which topic)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.cluster import ClusterMetadata
from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.partitioner import murmur2

from plaza.codec import encode_request
from plaza.connections import ensure_topics, kafka_producer
from plaza.contract import ENVELOPE_VERSION, InferRequest
from plaza.errors import InvalidInput, PayloadTooLarge, PlazaError, Unavailable
from plaza.naming import (
    CONTENT_TYPE_MSGPACK,
    HEADER_CONTENT_TYPE,
    HEADER_CORRELATION_ID,
    HEADER_ENVELOPE_VERSION,
    Names,
)
from plaza.sequence_batching import PARAM_ID
from plaza.settings import KafkaSettings
from plaza.single_flight import SingleFlight

log = logging.getLogger(__name__)


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
        """The topics this publisher keeps: made again when deleted (``forget_topics``)."""
        self._made: set[str] = set()
        """Topics this publisher made that the producer's metadata has not held since: a
        send to one waits for the producer to fetch their metadata, without making them
        again (``_make_if_missing``)."""
        self._tracked: set[str] = set()
        """Topics sent to: the producer's metadata refreshes ask for these only (for every
        topic before the first send), so only these can leave it by being deleted."""
        self._creating: SingleFlight[str, None] = SingleFlight()
        self._asking: SingleFlight[str, bool] = SingleFlight()
        self._in_metadata: set[str] = set()
        self._remaking: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._producer = kafka_producer(self._kafka)
        self._producer.client.cluster.add_listener(self._metadata_updated)
        await self._producer.start()

    async def stop(self) -> None:
        for task in self._remaking:
            task.cancel()
        await asyncio.gather(*self._remaking, return_exceptions=True)
        await self._creating.close()
        await self._asking.close()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def publish(self, req: InferRequest, topic: str) -> None:
        """Send ``req`` to ``topic`` and wait for the broker's acknowledgement (acks=all).

        Unavailable when Kafka does not take or acknowledge it within
        ``kafka.request_timeout_ms``; the record may still arrive later, so a retry should
        reuse the correlation id (workers answer an id once). No caller's deadline shortens
        the wait: a wait cut short would call a record Kafka may take unsent.
        """
        limit_s = self._kafka.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(limit_s):
                await (await self.send(req, topic))
        except TimeoutError:
            self._made.discard(topic)  # deleted before the producer saw it: check again
            raise Unavailable(
                f"Kafka did not acknowledge the request within {limit_s:g} s"
            ) from None
        except PlazaError:
            raise
        except Exception as exc:
            raise Unavailable(f"Kafka did not acknowledge the request: {exc}") from exc

    async def acknowledged(self, acks: Sequence[asyncio.Future[Any]]) -> None:
        """Wait for the acknowledgements of many sends, every one of them, within
        ``kafka.request_timeout_ms``: Unavailable when one failed or had not come by then.
        Either way each future is settled or timed out when this returns, so its state
        tells the caller which records Kafka took (``was_acknowledged``)."""
        if not acks:
            return
        limit_s = self._kafka.request_timeout_ms / 1000
        _, late = await asyncio.wait(acks, timeout=limit_s)
        failed = [exc for fut in acks if fut.done() and (exc := _failure(fut)) is not None]
        if failed:
            raise Unavailable(
                f"Kafka did not acknowledge {len(failed)} of {len(acks)} requests: {failed[0]}"
            ) from failed[0]
        if late:
            raise Unavailable(
                f"Kafka did not acknowledge {len(late)} of {len(acks)} requests "
                f"within {limit_s:g} s"
            )

    def encode(self, req: InferRequest) -> bytes:
        """The record's value, stamped with the moment of sending: InvalidInput for a
        request that does not encode (a field of a type the wire contract has no form for),
        PayloadTooLarge for one over ``kafka.max_request_bytes``. Neither is Kafka's doing,
        so neither is Unavailable (which invites a retry of the same bytes)."""
        try:
            value = encode_request(req, sent_us=time.time_ns() // 1000)
        except Exception as exc:  # msgspec raises TypeError, ValueError, OverflowError...
            raise InvalidInput(
                f"request {req.id} cannot be encoded: {exc}", model=req.model
            ) from exc
        if len(value) > self._kafka.max_request_bytes:
            raise PayloadTooLarge(
                f"request {req.id} is {len(value)} bytes; the limit is "
                f"{self._kafka.max_request_bytes} (kafka.max_request_bytes)",
                model=req.model,
                size=len(value),
            )
        return value

    async def send(self, req: InferRequest, topic: str) -> asyncio.Future[Any]:
        """Queue the record for ``topic`` (from ``Names.request_topic``) in the producer;
        returns the future of its acknowledgement.

        Many sends followed by awaiting their futures batch well (linger_ms). InvalidInput
        or PayloadTooLarge (``encode``) before anything is sent; Unavailable when Kafka
        does not take the record.
        """
        value = self.encode(req)
        if self._producer is None:
            raise Unavailable("publisher is not started")
        try:
            try:
                return await self._send_value(req, topic, value)
            except UnknownTopicOrPartitionError:
                # Deleted after the check in _send_value: nothing was queued (aiokafka
                # raises it before taking the record), so one more try cannot duplicate it.
                self._made.discard(topic)
                return await self._send_value(req, topic, value)
        except Exception as exc:
            raise Unavailable(f"Kafka did not take the request: {exc}") from exc

    async def _send_value(self, req: InferRequest, topic: str, value: bytes) -> asyncio.Future[Any]:
        """Queue ``value`` to ``topic``, making the topic first when it may be missing
        (``_make_if_missing``)."""
        assert self._producer is not None
        await self._make_if_missing(topic)
        partition = await self._sequence_partition(req, topic)
        fut: asyncio.Future[Any] = await self._producer.send(
            topic,
            value=value,
            key=req.id.encode(),
            headers=request_headers(req),
            partition=partition,
        )
        return fut

    async def _make_if_missing(self, topic: str) -> None:
        """Make ``topic`` unless the producer's metadata holds it (or this publisher made it
        since that last lacked it): Kafka would hold a send to a missing topic for
        ``kafka.request_timeout_ms``, then fail it. A topic new to this publisher is made
        at once; one its owner made (``topics_made``) is first asked of the producer's
        metadata, once, as that is fetched for the topics sent to only. Set and dict
        lookups alone on the usual path, as this runs on every send."""
        if topic in self._made:
            return
        assert self._producer is not None
        client = self._producer.client
        if topic in self._known_topics:
            if client.cluster.partitions_for_topic(topic) is not None:
                return
            if topic not in self._tracked and await self._asking.run(
                topic, lambda: self._in_fetched_metadata(topic)
            ):
                return
        await self._ensure_topic(topic)
        self._known_topics.add(topic)
        self._tracked.add(topic)

    async def _in_fetched_metadata(self, topic: str) -> bool:
        """Have the producer fetch ``topic``'s metadata (and track it from now on): whether
        that holds it."""
        assert self._producer is not None
        client = self._producer.client
        client.add_topic(topic)
        await client.force_metadata_update()
        self._tracked.add(topic)
        return client.cluster.partitions_for_topic(topic) is not None

    def topics_made(self, topics: list[str]) -> None:
        """``topics`` were made by their owner with ``ensure_topics`` (a gateway's models'
        request topics): this publisher keeps them, making them again when deleted, until
        ``forget_topics``. The first send to each checks once that it still exists."""
        self._known_topics.update(topics)

    def forget_topics(self, topics: Iterable[str]) -> None:
        """Stop keeping ``topics`` (their model is no longer served here): a deletion of
        one is left alone. A later send to one makes it again and keeps it again."""
        for topic in topics:
            self._known_topics.discard(topic)
            self._made.discard(topic)

    async def _ensure_topic(self, topic: str) -> None:
        """Create ``topic`` if Kafka lacks it, once per publisher: the sends that come while
        it is being made wait for that one creation (``plaza.single_flight``), since each
        creation starts an admin client that reads the whole cluster's metadata. A failed
        creation is the error of every send that waited for it; the next send tries again."""

        async def create() -> None:
            await ensure_topics(self._kafka, [topic])
            self._made.add(topic)

        await self._creating.run(topic, create)

    def _metadata_updated(self, cluster: ClusterMetadata) -> None:
        """A topic this publisher sent to and keeps (``forget_topics``) that left the
        producer's metadata was deleted (an operator purging a backlog): make it again at
        once, with the configured partitions and replication, so that the records waiting
        for it in the producer (aiokafka retries them, never twice) and the sends after them
        go through. The producer learns of it at its next metadata refresh
        (``kafka.metadata_max_age_ms``) or when a send to it is refused."""
        present = cluster.topics()
        lost = (self._in_metadata - present) & self._known_topics & self._tracked
        self._in_metadata = present
        self._made = {topic for topic in self._made if topic not in present}
        for topic in lost:
            log.warning("topic %s was deleted; making it again", topic)
            task = asyncio.get_running_loop().create_task(self._remake(topic))
            self._remaking.add(task)
            task.add_done_callback(self._remaking.discard)

    async def _remake(self, topic: str) -> None:
        if topic not in self._known_topics:
            return  # forgotten meanwhile
        try:
            await self._ensure_topic(topic)
        except PlazaError as exc:  # the next send to it tries again
            log.warning("topic %s could not be made again: %s", topic, exc)

    async def _sequence_partition(self, req: InferRequest, topic: str) -> int | None:
        """A request of a sequence (its ``sequence_id`` parameter) goes to the partition its
        sequence id hashes to, as Kafka's default partitioner would place a record keyed by
        it: every request of the sequence reaches one worker, in order. None: by its key."""
        sequence = req.parameters.get(PARAM_ID) if req.parameters else None
        if sequence is None or isinstance(sequence, bool):
            return None
        assert self._producer is not None
        partitions = sorted(await self._producer.partitions_for(topic))
        digest = murmur2(str(sequence).encode()) & 0x7FFFFFFF
        return int(partitions[digest % len(partitions)])


def was_acknowledged(ack: asyncio.Future[Any]) -> bool:
    """Whether Kafka acknowledged the record of ``ack`` (a ``send``'s future) by now."""
    return ack.done() and _failure(ack) is None


def _failure(ack: asyncio.Future[Any]) -> BaseException | None:
    """The error of a settled ack (a cancelled one counts as failed); retrieving it also
    keeps asyncio from logging it as never retrieved."""
    if ack.cancelled():
        return asyncio.CancelledError()
    return ack.exception()
