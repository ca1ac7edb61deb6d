"""Two waits a deployment (or a test) may shorten, set like any setting:
``kafka.session_timeout_ms`` (the consumer group session timeout) and
``producer.stop_timeout_s`` (how long a stop waits for the Kafka producer's flush)."""

from __future__ import annotations

import pydantic
import pytest

from plaza.connections import kafka_consumer
from plaza.settings import KafkaSettings, PlazaSettings, ProducerSettings


def test_the_session_timeout_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLAZA_KAFKA__SESSION_TIMEOUT_MS", "4000")
    assert PlazaSettings().kafka.session_timeout_ms == 4000
    assert KafkaSettings().session_timeout_ms == 10_000  # the default, as before


def test_a_session_timeout_heartbeats_cannot_keep_alive_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 3000"):
        KafkaSettings(session_timeout_ms=2000)  # heartbeats go every second
    assert KafkaSettings(session_timeout_ms=3000).session_timeout_ms == 3000


async def test_a_group_consumer_uses_the_session_timeout() -> None:
    consumer = kafka_consumer(KafkaSettings(session_timeout_ms=4000), "group")
    try:
        assert consumer._session_timeout_ms == 4000  # aiokafka keeps it only here
    finally:
        await consumer.stop()


def test_the_producer_stop_timeout_is_read_from_the_environment_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLAZA_PRODUCER__STOP_TIMEOUT_S", "1.5")
    assert PlazaSettings().producer.stop_timeout_s == 1.5
    assert ProducerSettings().stop_timeout_s == 10.0  # the default, as before
    with pytest.raises(pydantic.ValidationError, match="greater than 0"):
        ProducerSettings(stop_timeout_s=0)
