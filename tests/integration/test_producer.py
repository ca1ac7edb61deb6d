"""The producer core (plaza.producer) on real Kafka and Redis, through the gateway and the SDK.

A job marker only after the broker's ack (a stopped broker: 503, no marker); the in-flight
byte budget (503 past it, every accepted request answered); the marker's TTL; and an SDK
without a repository publishing to the topic a worker reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis.asyncio
from aiokafka import TopicPartition

from plaza.client import PlazaClient, make_request
from plaza.connections import kafka_consumer, key_partition
from plaza.errors import Unavailable
from plaza.gateway.app import create_app
from plaza.gateway.service import GatewayService
from plaza.settings import PlazaSettings, ProducerSettings
from plaza.stack import KafkaCluster
from tests.support import REPOSITORY, make_settings, running_worker

HEADER = "Inference-Header-Content-Length"
MiB = 1024 * 1024


def only_identity(tmp_path: Path) -> Path:
    """A repository with just the identity model (its files linked, not copied)."""
    root = tmp_path / "repo"
    (root / "identity" / "1").mkdir(parents=True)
    (root / "identity" / "config.pbtxt").symlink_to(REPOSITORY / "identity" / "config.pbtxt")
    (root / "identity" / "1" / "model.onnx").symlink_to(REPOSITORY / "identity/1/model.onnx")
    return root


@asynccontextmanager
async def gateway(settings: PlazaSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway's app on a started service, in process (no sockets)."""
    service = GatewayService(settings)
    await service.start()
    try:
        transport = httpx.ASGITransport(app=create_app(settings, service))
        async with httpx.AsyncClient(transport=transport, base_url="http://plaza") as client:
            yield client
    finally:
        await service.stop()


def identity_json(*values: float) -> dict[str, Any]:
    data = list(values)
    return {
        "inputs": [{"name": "INPUT0", "shape": [1, len(data)], "datatype": "FP32", "data": data}]
    }


def identity_binary(x: np.ndarray[Any, Any]) -> tuple[bytes, dict[str, str]]:
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    header = orjson.dumps(doc)
    return header + x.tobytes(), {HEADER: str(len(header))}


async def job_keys(client: redis.asyncio.Redis, settings: PlazaSettings) -> list[bytes]:
    pattern = settings.names.job_key("*")
    return [key async for key in client.scan_iter(match=pattern, count=1000)]


@pytest.mark.timeout(240)
async def test_a_stopped_broker_answers_503_and_marks_no_job(
    kafka_cluster_factory: Callable[..., KafkaCluster],
    redis_url: str,
    unique_id: str,
    redis_client: redis.asyncio.Redis,
    tmp_path: Path,
) -> None:
    cluster = kafka_cluster_factory(nodes=1)
    s = make_settings(
        cluster.bootstrap_servers,
        redis_url,
        unique_id,
        repository=only_identity(tmp_path),
        kafka={"request_timeout_ms": 4000},
        gateway={"sync_timeout_s": 2.0},  # shorter than a publish may take: still no 504
    )
    # The stopped broker never takes the SDK's unsent records: its stop waits all of this.
    s = s.model_copy(update={"producer": s.producer.model_copy(update={"stop_timeout_s": 1.0})})
    async with gateway(s) as http, PlazaClient(s) as sdk:
        accepted = await http.post("/v2/models/identity/jobs", json=identity_json(1.0))
        assert accepted.status_code == 202, accepted.text  # the broker is up: a real job
        assert len(await job_keys(redis_client, s)) == 1
        cluster.stop()
        x = np.ones((1, 2), np.float32)
        # At once, not one after another: each waits out the 4 s request timeout.
        sync, job, submitted, inferred = await asyncio.gather(
            http.post("/v2/models/identity/infer", json=identity_json(2.0)),
            http.post("/v2/models/identity/jobs", json=identity_json(3.0)),
            sdk.submit("identity", {"INPUT0": x}),
            sdk.infer("identity", {"INPUT0": x}, timeout_s=5),
            return_exceptions=True,
        )
    for refused in (submitted, inferred):
        assert isinstance(refused, Unavailable), repr(refused)
    for response in (sync, job):
        assert isinstance(response, httpx.Response), repr(response)
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "unavailable" and "job_id" not in response.json()
    assert len(await job_keys(redis_client, s)) == 1  # only the job Kafka acknowledged


@pytest.mark.timeout(180)
async def test_past_the_byte_budget_requests_get_503_and_every_accepted_one_is_answered(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    s = settings.model_copy(
        update={
            "repository": only_identity(tmp_path),
            "producer": ProducerSettings(max_inflight_bytes=4 * MiB),
        }
    )
    rows = [np.full((1, MiB // 4), i, np.float32) for i in range(32)]  # 1 MiB each
    statuses: list[int] = []
    async with running_worker(s, "identity"), gateway(s) as http:

        async def call(x: np.ndarray[Any, Any]) -> int:
            body, headers = identity_binary(x)
            response = await http.post("/v2/models/identity/infer", content=body, headers=headers)
            if response.status_code == 200:
                length = int(response.headers[HEADER])
                out = np.frombuffer(response.content[length:], np.float32)
                np.testing.assert_array_equal(out, x.reshape(-1))
            else:
                assert response.json()["code"] == "queue_full", response.text
                assert "max_inflight_bytes" in response.json()["error"]
            return response.status_code

        for _ in range(5):  # rounds of 32 at once, until the budget has refused some
            statuses += await asyncio.gather(*(call(x) for x in rows))
            if 503 in statuses:
                break
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) > 0 and statuses.count(200) > 0


async def test_a_job_marker_outlives_the_queue_bound_plus_the_result_ttl(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    s = settings.model_copy(
        update={
            "redis": settings.redis.model_copy(update={"result_ttl_s": 100}),
            "producer": ProducerSettings(max_queued_s=5000),
        }
    )
    x = {"INPUT0": np.ones((1, 2), np.float32)}
    async with PlazaClient(s) as client:  # no worker: the jobs stay queued
        plain = await client.submit("identity", x)
        bounded = await client.submit("identity", x, timeout_s=30)
        assert (await client.poll(plain)).state == "pending"
    plain_ttl = await redis_client.ttl(s.names.job_key(plain))
    bounded_ttl = await redis_client.ttl(s.names.job_key(bounded))
    assert 5000 < plain_ttl <= 5100  # longer than the result TTL alone
    assert 100 + 30 < bounded_ttl <= 100 + 30 + 61  # the deadline bounds the wait


async def test_the_sdk_without_a_repository_publishes_where_the_worker_reads(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    blind = settings.model_copy(update={"repository": tmp_path / "no-repository"})
    x = {"INPUT0": np.full((1, 3), 7.0, np.float32)}
    async with running_worker(settings, "identity"), PlazaClient(blind) as client:
        result = await client.infer("identity", x, priority=2, timeout_s=60)
    np.testing.assert_array_equal(result.output("OUTPUT0").to_numpy(), x["INPUT0"])


async def test_a_pipeline_larger_than_the_byte_budget_waits_for_acks_instead_of_failing(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    s = settings.model_copy(update={"producer": ProducerSettings(max_inflight_bytes=2 * MiB)})
    async with PlazaClient(s) as client:
        stream = client.results_stream("big")
        x = {"INPUT0": np.zeros((1, MiB // 4), np.float32)}  # 1 MiB: two fit at a time
        requests = [make_request("identity", x, reply_stream=stream) for _ in range(8)]
        ids = await client.publish_many(requests)
        assert ids == [r.id for r in requests]
        assert client.producer.inflight.used == 0
        topic = s.names.request_topic("identity")
        assert await client.producer.backlog.lag("identity", topic) == 8  # all in Kafka


async def test_requests_go_to_the_partition_their_correlation_id_picks(
    settings: PlazaSettings,
) -> None:
    """Every published request lands on ``key_partition``'s choice for its id (the fault
    audit's way of telling whose partition a request was on), and 40 ids spread."""
    async with PlazaClient(settings) as client:
        x = {"INPUT0": np.zeros((1, 3), np.float32)}
        requests = [make_request("identity", x) for _ in range(40)]
        await client.publish_many(requests)
    every = list(range(settings.kafka.partitions))
    topic = settings.names.request_topic("identity")
    consumer = kafka_consumer(settings.kafka, f"{settings.kafka.topic_prefix}placement")
    await consumer.start()
    placed: dict[str, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p) for p in every])
        async with asyncio.timeout(30):
            while len(placed) < len(requests):
                got = await consumer.getmany(timeout_ms=500)
                for records in got.values():
                    placed.update((r.key.decode(), r.partition) for r in records if r.key)
    finally:
        await consumer.stop()
    assert set(placed) == {r.id for r in requests}
    assert all(part == key_partition(rid.encode(), every, every) for rid, part in placed.items())
    assert len(set(placed.values())) > 1
