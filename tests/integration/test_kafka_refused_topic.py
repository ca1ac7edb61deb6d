"""A topic that the cluster cannot make with Plaza's settings (more replicas than brokers)
is a ConfigError, not Unavailable: a process exits 1 on it and its supervisor gives the
model up, where an Unavailable (exit 75) would be restarted into the same refusal forever.
Real Kafka (one broker)."""

from __future__ import annotations

import pytest

from plaza.connections import ensure_topics
from plaza.errors import ConfigError
from plaza.settings import PlazaSettings


@pytest.mark.timeout(60)
async def test_more_replicas_than_brokers_is_a_config_error(settings: PlazaSettings) -> None:
    kafka = settings.kafka.model_copy(update={"replication_factor": 3})
    topic = settings.names.request_topic("refused")
    with pytest.raises(ConfigError, match=r"kafka\.replication_factor.*cannot create topic"):
        await ensure_topics(kafka, [topic])
