"""An ensemble runner consumes as a worker does (tests/integration/test_consumer_offsets.py
for the worker), and names its generation as a worker does.

- Offsets its consumer hands over no record for (a transaction's commit or abort marker, an
  aborted transaction's records; ``read_committed``) are committed once every record before
  them is answered: else a transactional producer leaves the ensemble's group a backlog for
  good (``max_queue_size`` counts it).
- Its fetcher reads ahead a quarter of the byte budget over every partition of its topics,
  never less than one record of the largest accepted size.
- A runner that a host started from the model table names that generation in its registry
  entry: a load waits for a runner of its own generation, not any runner's heartbeat.

Real Kafka and Redis; the ensemble ``chain`` runs ``identity`` (ONNX) in two steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from plaza.client import make_request
from plaza.codec import encode_request
from plaza.connections import ensure_topics
from plaza.model_control import ModelTable, serves_generation
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from plaza.workers.host import Host
from tests.integration.test_ensemble import CHAIN  # identity, then identity again
from tests.integration.test_host_follow import following
from tests.support import (
    REPOSITORY,
    group_offsets,
    make_settings,
    running_worker,
    wait_for,
    with_model,
)

pytestmark = pytest.mark.timeout(180)

ENSEMBLE = "chain"


def repository(tmp_path: Path) -> Path:
    """identity (the sample's ONNX file) and ``chain`` over it (identity twice)."""
    root = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "identity", root / "identity")
    (root / ENSEMBLE / "1").mkdir(parents=True)
    (root / ENSEMBLE / "config.pbtxt").write_text(CHAIN)
    return root


@contextlib.asynccontextmanager
async def running_runner(settings: PlazaSettings) -> AsyncIterator[EnsembleRunner]:
    runner = EnsembleRunner(with_model(settings, ENSEMBLE))
    await runner.start()
    try:
        yield runner
    finally:
        await runner.stop()


async def committed_and_ends(settings: PlazaSettings, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of ``topic``: the ensemble group's committed offset (-1: none) and the
    partition's end offset."""
    tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
    found = await group_offsets(settings, ENSEMBLE, tps)
    return {tp.partition: offsets for tp, offsets in found.items()}


async def publish_transactions(bootstrap: str, topic: str, unique_id: str) -> list[str]:
    """A committed transaction of 3 ensemble requests on partition 0 (its commit marker at
    offset 3) and an aborted one of 5 on partition 1 (never handed over, and the abort
    marker at offset 5). The committed requests' ids."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{unique_id}-{uuid.uuid4().hex}"
    )
    await producer.start()
    ids: list[str] = []
    try:
        async with producer.transaction():
            for n in range(3):
                req = make_request(ENSEMBLE, {"INPUT0": np.full((1, 3), n, np.float32)})
                ids.append(req.id)
                await producer.send(topic, encode_request(req), key=req.id.encode(), partition=0)
        await producer.begin_transaction()
        for n in range(5):
            req = make_request(ENSEMBLE, {"INPUT0": np.full((1, 3), 100 + n, np.float32)})
            await producer.send(topic, encode_request(req), key=req.id.encode(), partition=1)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    return ids


async def test_transaction_markers_and_aborted_records_are_committed_by_the_runner(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=repository(tmp_path))
    topic = settings.names.request_topic(ENSEMBLE)
    async with running_worker(settings, "identity"), running_runner(settings) as runner:
        ids = await publish_transactions(kafka_bootstrap, topic, unique_id)

        async def answered() -> bool:
            found = [await runner.redis.exists(settings.names.result_key(r)) for r in ids]
            return all(found)

        async def at_the_ends() -> bool:
            state = await committed_and_ends(settings, topic)
            return all(done == end for done, end in state.values())

        await wait_for(answered, 60, "the committed transaction's ensemble answers")
        await wait_for(at_the_ends, 30, "the runner's commits to the ends")
        assert await committed_and_ends(settings, topic) == {0: (4, 4), 1: (6, 6)}
    assert await committed_and_ends(settings, topic) == {0: (4, 4), 1: (6, 6)}


@pytest.mark.parametrize(
    "max_request_bytes",
    [
        256 * 1024,  # a quarter of the budget over 8 partitions holds such records
        8 << 20,  # it does not: one record of the largest size per partition
    ],
)
async def test_the_runners_read_ahead_is_a_quarter_of_the_budget_over_all_partitions(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, max_request_bytes: int
) -> None:
    budget = 16 << 20
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=repository(tmp_path),
        kafka={"max_request_bytes": max_request_bytes},
        worker={"max_pending_bytes": budget},
    )
    kafka = settings.kafka.model_copy(update={"partitions": 8})
    settings = settings.model_copy(update={"kafka": kafka})
    await ensure_topics(settings.kafka, [settings.names.request_topic(ENSEMBLE)])
    async with running_runner(settings) as runner:
        fetcher: Any = runner.consumer._fetcher  # what aiokafka buffers (no public getter)
        per_partition = fetcher._max_partition_fetch_bytes
        per_fetch = fetcher._fetch_max_bytes
    largest = max_request_bytes + 64 * 1024  # a record and its batch's overhead
    assert per_partition >= largest  # every accepted record can be fetched
    assert per_partition * 8 <= budget // 4 or per_partition == largest  # else the floor only
    assert per_fetch <= max(per_partition, budget // 4)


async def test_a_runner_started_by_a_host_names_its_generation(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: Any
) -> None:
    """The host's runner of ``chain`` counts for the table's generation of ``chain`` and
    for no other (a runner of an older config must not answer a reload's wait)."""
    made = make_settings(kafka_bootstrap, redis_url, unique_id, repository=repository(tmp_path))
    settings = following(made)
    client = aioredis.Redis.from_url(redis_url)
    table = ModelTable(client, settings.names)
    host = Host(settings)
    stop = asyncio.Event()
    await host.start()
    task = asyncio.create_task(host.run_until_stopped(stop))
    try:
        desired = await table.load(ENSEMBLE)
        key = settings.names.worker_info_key(f"fh.{ENSEMBLE}")

        async def registered() -> bool:
            return await client.get(key) is not None

        await wait_for(registered, 60, "the host's runner of chain in the registry")
        raw = await client.get(key)
        assert raw is not None
        info = json.loads(raw)
        assert info["kind"] == "ensemble"
        assert info.get("generation") == desired.generation
        names, group = settings.names, [ENSEMBLE]
        assert await serves_generation(client, names, group, desired.generation)
        assert not await serves_generation(client, names, group, desired.generation + 1)
    finally:
        stop.set()
        await task
        await client.aclose()
