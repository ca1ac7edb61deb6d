"""The backlog probe's consumer (what ``max_queue_size`` is checked on) refreshes its Kafka
metadata every ``kafka.metadata_max_age_ms``, as the workers and the producer do: else a
partition added to a level's topic stays out of its backlog for aiokafka's five minutes."""

from __future__ import annotations

from plaza.queueing import backlog_consumer
from plaza.settings import KafkaSettings


async def test_the_probe_consumer_refreshes_metadata_at_the_setting_age() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1", metadata_max_age_ms=1500)
    consumer = backlog_consumer(kafka)  # built only, never started: no broker is asked
    # the client's metadata synchroniser waits this long between refreshes
    assert consumer._client._metadata_max_age_ms == 1500


async def test_the_probe_consumer_has_no_group_and_counts_to_the_high_water_mark() -> None:
    consumer = backlog_consumer(KafkaSettings(bootstrap_servers="127.0.0.1:1"))
    assert consumer._group_id is None  # it commits nothing and joins no worker group
    assert consumer._isolation_level == "read_uncommitted"
