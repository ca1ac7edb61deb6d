"""Queue admission before publishing: ``max_queue_size`` per priority level.

The queue of a model is its Kafka backlog: records its worker group has not committed yet
(end offset minus committed offset, or minus the log start offset where retention deleted
records the group had not reached, per partition of the level's topic). The producer core
(``plaza.producer``, for the gateway and the SDK) measures it here, cached for a moment, and
refuses a request with QueueFull at once when the level's ``max_queue_size`` is reached,
instead of letting the backlog grow without bound. When the cached figure has expired, the
requests that come while it is measured again wait for that one measurement
(``plaza.single_flight``) instead of each making its own three round trips (made at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from plaza.connections import kafka_admin, kafka_consumer
from plaza.errors import QueueFull
from plaza.modelconfig import ModelSpec
from plaza.naming import Names
from plaza.settings import KafkaSettings
from plaza.single_flight import SingleFlight

log = logging.getLogger(__name__)


def backlog_consumer(kafka: KafkaSettings) -> AIOKafkaConsumer:
    """The probe's consumer: no group, only offsets asked of it. Built by the shared
    helper, so its metadata (the topic's partitions) is refreshed every
    ``kafka.metadata_max_age_ms``: a partition added to a level's topic counts in its backlog
    within that, as it is published to and served within it (aiokafka's own default is
    five minutes). End offsets are high-water marks, as before (``read_uncommitted``)."""
    return kafka_consumer(kafka, None, isolation_level="read_uncommitted")


class BacklogProbe:
    """Consumer lag of a worker group on one topic, cached for ``ttl_s``."""

    def __init__(self, kafka: KafkaSettings, names: Names) -> None:
        self._kafka = kafka
        self._names = names
        self._ttl_s = kafka.backlog_check_ttl_ms / 1000
        self._cache: dict[str, tuple[float, int]] = {}
        self._measuring: SingleFlight[str, int] = SingleFlight()
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self._admin = kafka_admin(self._kafka)
        await self._admin.start()
        self._consumer = backlog_consumer(self._kafka)
        await self._consumer.start()

    async def stop(self) -> None:
        await self._measuring.close()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()
        self._admin = self._consumer = None

    async def lag(self, model: str, topic: str) -> int:
        """Records on ``topic`` that the model's workers have not committed yet."""
        cached = self._cache.get(topic)
        if cached and time.monotonic() - cached[0] < self._ttl_s:
            return cached[1]

        async def measure() -> int:
            now = time.monotonic()
            value = await self._measure(model, topic)
            self._cache[topic] = (now, value)
            return value

        return await self._measuring.run(topic, measure)

    async def _measure(self, model: str, topic: str) -> int:
        if self._admin is None or self._consumer is None:
            raise RuntimeError("BacklogProbe is not started")
        parts = self._consumer.partitions_for_topic(topic)
        if not parts:
            await self._consumer._client.force_metadata_update()
            parts = self._consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return 0
        ends, starts, committed = await asyncio.gather(
            self._consumer.end_offsets(tps),
            self._consumer.beginning_offsets(tps),
            self._committed(model, tps),
        )
        if committed is None:
            return 0  # the group coordinator is away: do not refuse work on a guess
        total = 0
        for tp in tps:
            meta = committed.get(tp)
            # Records below the log start are gone (retention, delete_records): not a
            # backlog, though the group (no worker running) has not committed past them.
            done = max(meta.offset if meta is not None else -1, starts[tp])
            total += max(0, ends[tp] - done)
        return total

    async def _committed(
        self, model: str, tps: list[TopicPartition]
    ) -> dict[TopicPartition, Any] | None:
        """The worker group's committed offsets; None if its coordinator stays unavailable
        (a new cluster loads __consumer_offsets on first use, a failover moves it)."""
        assert self._admin is not None
        for attempt in range(5):
            try:
                offsets: dict[TopicPartition, Any] = await self._admin.list_consumer_group_offsets(
                    self._names.consumer_group(model), partitions=tps
                )
                return offsets
            except KafkaError as exc:
                if not getattr(exc, "retriable", False):
                    raise
                await asyncio.sleep(0.05 * 2**attempt)
        log.warning("backlog of %s unknown: its group coordinator is unavailable", model)
        return None


class QueueGuard:
    """Refuses requests whose priority level's queue is at ``max_queue_size``."""

    def __init__(self, probe: BacklogProbe, names: Names) -> None:
        self._probe = probe
        self._names = names

    async def check(self, spec: ModelSpec, level: int) -> None:
        """QueueFull when ``level``'s queue (a settled level) holds max_queue_size."""
        limit = spec.batching.queue_policy(level).max_queue_size
        if not limit:
            return
        depth = await self._probe.lag(spec.name, self._names.request_topic(spec.name, level))
        if depth >= limit:
            raise QueueFull(
                f"model {spec.name!r} queue (priority level {level or 'default'}) holds "
                f"{depth} requests; max_queue_size is {limit}",
                depth=depth,
            )
