"""The gateway's readiness check of Kafka, on real Kafka and Redis.

Whether Kafka answers is a metadata read of the gateway's topics, kept for a second. When
that verdict has expired, the probes that come together (a load balancer's, an
orchestrator's, several clients') share one read instead of each making its own. The read
is the admin client's real ``describe_topics``, counted by a wrapper around it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from plaza.gateway.service import GatewayService
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, model_variant

PROBES = 16


async def test_overlapping_readiness_probes_read_kafka_once(
    settings: PlazaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    s = settings.model_copy(update={"repository": model_variant(tmp_path, "identity", config)})
    reads: list[list[str]] = []
    describe = AIOKafkaAdminClient.describe_topics

    async def counted(admin: AIOKafkaAdminClient, topics: list[str], *args: Any) -> Any:
        reads.append(list(topics))
        return await describe(admin, topics, *args)

    monkeypatch.setattr(AIOKafkaAdminClient, "describe_topics", counted)
    service = GatewayService(s)
    await service.start()
    try:
        reads.clear()  # only the probes' reads count
        verdicts = await asyncio.gather(*(service.ready() for _ in range(PROBES)))
        shared = list(reads)
    finally:
        await service.stop()
    assert shared == [[s.names.request_topic("identity")]]
    # No worker runs: not ready, for that reason alone, and every probe says the same.
    assert {v.reasons for v in verdicts} == {("model identity has no live worker",)}
