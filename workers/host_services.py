"""What the workers of one host share: the device, its scheduler, /metrics, Redis, a producer.

Sharing is safe where a client is made for concurrent use in one event loop: the Redis
client (a connection pool), the Kafka producer (dead letters only), the metrics hub (one
port, a ``model`` label per sample) and the device scheduler (pure state on the loop). Each
worker keeps its own consumer (its model's consumer group), batcher, instances and writer
state. A worker made without a host gets services of its own and closes them when it stops.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from plaza.connections import kafka_producer, redis_client
from plaza.settings import PlazaSettings
from plaza.workers.device import Device, select_device
from plaza.workers.device_scheduler import DeviceScheduler, parse_budget
from plaza.workers.metrics import MetricsHub


@dataclass(slots=True)
class HostServices:
    """One process's shared clients and device; ``start`` once, ``close`` once."""

    settings: PlazaSettings
    device: Device
    scheduler: DeviceScheduler
    metrics: MetricsHub
    redis: aioredis.Redis
    _producer: AIOKafkaProducer | None = None

    @classmethod
    def create(cls, settings: PlazaSettings) -> HostServices:
        """The device chosen, the scheduler with the host's slots and resource budget."""
        host = settings.host
        return cls(
            settings=settings,
            device=select_device(settings.worker.device),
            scheduler=DeviceScheduler(host.execution_slots, parse_budget(host.resources)),
            metrics=MetricsHub(settings.worker),
            redis=redis_client(settings.redis),
        )

    @property
    def producer(self) -> AIOKafkaProducer:
        """The dead-letter producer (once started)."""
        if self._producer is None:
            raise RuntimeError("host services are not started")
        return self._producer

    async def start(self) -> None:
        """Start the producer (it needs the running loop); idempotent."""
        if self._producer is None:
            producer = kafka_producer(self.settings.kafka)
            await producer.start()
            self._producer = producer

    async def close(self) -> None:
        """Stop the producer, close Redis, stop serving /metrics."""
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        await self.redis.aclose()
        self.metrics.close()
