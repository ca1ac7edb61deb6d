"""A worker holding offsets not yet committed when an operator deletes its request topic
gives them up (they can never be committed: the records are gone, and the topic made again
starts at 0) instead of retrying the commit for as long as the topic is missing and then
committing the old offsets to the new topic; it warns once, serves the new topic and commits
its offsets. Real Kafka and Redis."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from plaza.client import PlazaClient
from plaza.connections import kafka_admin
from plaza.settings import PlazaSettings
from tests.support import group_offsets, make_settings, running_worker, wait_for

MODEL = "identity"
HELD = 11
"""Requests answered while the worker's committer waits (``commit_interval_ms``): more than
twice the requests sent to the new topic, so that some partition's held offset is past it."""


def inputs(n: int) -> dict[str, np.ndarray]:
    return {"INPUT0": np.full((1, 2), n, np.float32)}


async def committed_to_the_end(settings: PlazaSettings, topic: str) -> bool:
    tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    state = await group_offsets(settings, MODEL, tps)
    return all(done == end for done, end in state.values())


def warnings_naming(caplog: pytest.LogCaptureFixture, topic: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "plaza.workers.commit" and topic in r.getMessage() and "gone" in r.getMessage()
    ]


@pytest.mark.timeout(60)
async def test_offsets_of_a_deleted_topic_are_given_up_and_the_new_topic_served(
    kafka_bootstrap: str, redis_url: str, unique_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="plaza.workers.commit")
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        kafka={"metadata_max_age_ms": 1000},
        worker={"commit_interval_ms": 3000},  # the first commit at once, the next 3 s later
    )
    topic = settings.names.request_topic(MODEL)
    client = PlazaClient(settings)
    admin = kafka_admin(settings.kafka)
    await client.start()
    await admin.start()
    try:
        async with running_worker(settings, MODEL) as worker:
            await client.infer(MODEL, inputs(0))
            # the committer has just committed every partition: it waits 3 s before the next
            await wait_for(lambda: not worker.offsets.to_commit(), 15, "the first commits")
            await asyncio.gather(*(client.infer(MODEL, inputs(n)) for n in range(1, HELD + 1)))
            held = worker.offsets.to_commit()
            assert held, "the answered requests' offsets are not held uncommitted"

            await admin.delete_topics([topic])
            await wait_for(
                lambda: worker.offsets.abandoned_count >= len(held), 15, "the offsets given up"
            )

            for n in (100, 101):  # published to the topic made again, and answered
                got = await client.infer(MODEL, inputs(n), timeout_s=15)
                assert got.as_numpy()["OUTPUT0"].tolist() == [[n, n]]
            await wait_for(lambda: committed_to_the_end(settings, topic), 15, "the new commits")

            tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
            ends = [end for _, end in (await group_offsets(settings, MODEL, tps)).values()]
            assert sum(ends) == 2  # the new topic holds only the two new requests
            assert worker.offsets.to_commit() == {}  # nothing of the old topic is offered again
            assert worker.offsets.abandoned_count == len(held)  # each given up once
            assert len(warnings_naming(caplog, topic)) == 1
    finally:
        await admin.close()
        await client.stop()
