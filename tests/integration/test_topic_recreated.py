"""A request topic deleted under a running client (an operator purging a backlog) is made
again by the client's publisher, with the configured partitions, and the running worker
takes it in within ``kafka.metadata_max_age_ms``: requests published after the deletion
are answered, each published once. Real Kafka and Redis."""

from __future__ import annotations

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from plaza.client import PlazaClient
from plaza.connections import kafka_admin
from plaza.settings import PlazaSettings
from tests.support import group_offsets, make_settings, running_worker, wait_for

MODEL = "identity"


def inputs(n: int) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, 2), n, np.float32)}


async def committed_to_the_end(settings: PlazaSettings, topic: str) -> bool:
    tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    state = await group_offsets(settings, MODEL, tps)
    return all(done == end for done, end in state.values())


@pytest.mark.timeout(120)
async def test_a_deleted_request_topic_is_made_again_and_served(
    kafka_bootstrap: str, redis_url: str, unique_id: str
) -> None:
    settings = make_settings(
        kafka_bootstrap, redis_url, unique_id, kafka={"metadata_max_age_ms": 1000}
    )
    topic = settings.names.request_topic(MODEL)
    client = PlazaClient(settings)
    admin = kafka_admin(settings.kafka)
    await client.start()
    await admin.start()
    try:
        async with running_worker(settings, MODEL) as worker:
            await client.infer(MODEL, inputs(1))
            await wait_for(lambda: committed_to_the_end(settings, topic), 30, "the commit")

            await admin.delete_topics([topic])

            async def deleted() -> bool:
                return topic not in await admin.list_topics()

            await wait_for(deleted, 30, "the topic's deletion")
            for n in (2, 3):
                got = await client.infer(MODEL, inputs(n), timeout_s=30)
                assert got.as_numpy()["OUTPUT0"].tolist() == [[n, n]]
            described = await admin.describe_topics([topic])
            assert len(described[0]["partitions"]) == settings.kafka.partitions
            await wait_for(lambda: committed_to_the_end(settings, topic), 30, "the new commits")
            tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
            ends = [end for _, end in (await group_offsets(settings, MODEL, tps)).values()]
            assert sum(ends) == 2  # each request published once into the new topic
            assert worker.metrics.records["dead_lettered"] == 0
    finally:
        await admin.close()
        await client.stop()
