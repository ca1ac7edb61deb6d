"""A publisher makes again a request topic deleted before its first send to it (its owner
had made it: ``topics_made``), and leaves deleted the topics it was told to forget (a model
no longer served). Real Kafka."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from plaza.client import make_request
from plaza.connections import ensure_topics, kafka_admin
from plaza.contract import InferRequest
from plaza.gateway.service import GatewayService
from plaza.publisher import RequestPublisher
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, make_settings, model_variant, wait_for


def request(model: str) -> InferRequest:
    return InferRequest(id=uuid.uuid4().hex, model=model, version="", inputs=())


@pytest.fixture
async def admin(
    kafka_bootstrap: str, redis_url: str, unique_id: str
) -> AsyncIterator[AIOKafkaAdminClient]:
    client = kafka_admin(make_settings(kafka_bootstrap, redis_url, unique_id).kafka)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def delete(admin: AIOKafkaAdminClient, topics: list[str]) -> None:
    await admin.delete_topics(topics)

    async def gone() -> bool:
        return not set(topics) & set(await admin.list_topics())

    await wait_for(gone, 30, f"the deletion of {topics}")


@pytest.mark.timeout(90)
async def test_a_topic_deleted_before_the_first_send_is_made_again(
    kafka_bootstrap: str, redis_url: str, unique_id: str, admin: AIOKafkaAdminClient
) -> None:
    # request_timeout_ms bounds the publish that fails without the fix
    settings: PlazaSettings = make_settings(
        kafka_bootstrap, redis_url, unique_id, kafka={"request_timeout_ms": 10_000}
    )
    topic = settings.names.request_topic("m")
    await ensure_topics(settings.kafka, [topic])
    publisher = RequestPublisher(settings.kafka, settings.names)
    await publisher.start()
    try:
        publisher.topics_made([topic])  # as a gateway does at start
        await delete(admin, [topic])
        await publisher.publish(request("m"), topic)
        await publisher.publish(request("m"), topic)
        described = await admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == settings.kafka.partitions
    finally:
        await publisher.stop()


@pytest.mark.timeout(90)
async def test_a_forgotten_topic_stays_deleted(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    admin: AIOKafkaAdminClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings(
        kafka_bootstrap, redis_url, unique_id, kafka={"metadata_max_age_ms": 1000}
    )
    kept, retired = settings.names.request_topic("kept"), settings.names.request_topic("retired")
    publisher = RequestPublisher(settings.kafka, settings.names)
    await publisher.start()
    caplog.set_level(logging.WARNING, logger="plaza.publisher")
    try:
        await publisher.publish(request("kept"), kept)
        await publisher.publish(request("retired"), retired)
        publisher.forget_topics([retired])  # its model was unloaded
        await delete(admin, [kept, retired])  # one deletion: one metadata refresh sees both

        def deleted_seen() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "plaza.publisher"]

        def remade() -> bool:
            return any(kept in message for message in deleted_seen())

        await wait_for(remade, 30, f"{kept} seen deleted by the publisher")

        async def kept_exists() -> bool:
            return kept in await admin.list_topics()

        await wait_for(kept_exists, 30, f"{kept} made again")
        assert not [message for message in deleted_seen() if retired in message]
        assert retired not in await admin.list_topics()
        await publisher.publish(request("kept"), kept)
    finally:
        await publisher.stop()


@pytest.mark.timeout(90)
async def test_a_gateway_leaves_deleted_the_topic_of_a_model_it_unloaded(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    admin: AIOKafkaAdminClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    for name in ("kept", "retired"):
        model_variant(tmp_path, name, config.replace('"identity"', f'"{name}"'))
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=tmp_path,
        kafka={"metadata_max_age_ms": 1000},
        gateway={"model_control_mode": "explicit", "models": "kept,retired"},
    )
    kept, retired = settings.names.request_topic("kept"), settings.names.request_topic("retired")
    x = {"INPUT0": np.zeros((1, 3), np.float32)}
    service = GatewayService(settings)
    await service.start()
    caplog.set_level(logging.WARNING, logger="plaza.publisher")
    try:
        await service.submit(make_request("kept", x))
        await service.submit(make_request("retired", x))
        await service.unload_model("retired")
        await delete(admin, [kept, retired])  # one deletion: one metadata refresh sees both

        def deleted_seen() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "plaza.publisher"]

        await wait_for(lambda: any(kept in m for m in deleted_seen()), 30, f"{kept} seen gone")

        async def kept_exists() -> bool:
            return kept in await admin.list_topics()

        await wait_for(kept_exists, 30, f"{kept} made again")
        assert not [message for message in deleted_seen() if retired in message]
        assert retired not in await admin.list_topics()
    finally:
        await service.stop()
