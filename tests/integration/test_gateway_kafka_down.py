"""The HTTP gateway while its Kafka is down, over real sockets, Kafka, Redis and a worker.

The gateway serves on a free port; the test stops the test's own one-broker Kafka
under it. Infer and job submit must answer 503 ``unavailable`` at once (nothing published,
no job marker), readiness must say Kafka is the reason, liveness stays up; when the broker
is back the same gateway is ready again and a job it accepts is answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio

from plaza.settings import PlazaSettings
from plaza.stack import KafkaCluster
from tests.support import REPOSITORY, gateway_fronts, make_settings, running_worker, wait_for

MODEL = "identity"
READY_S = 120.0
"""Bound on the waits for readiness (a worker joining, a broker coming back)."""


def only_identity(tmp_path: Path) -> Path:
    """A repository with just the identity model (readiness wants a worker per model)."""
    root = tmp_path / "repo"
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").symlink_to(REPOSITORY / MODEL / "config.pbtxt")
    (root / MODEL / "1" / "model.onnx").symlink_to(REPOSITORY / MODEL / "1" / "model.onnx")
    return root


@asynccontextmanager
async def serving(settings: PlazaSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway on a free 127.0.0.1 port, and a client for it."""
    async with (
        gateway_fronts(settings) as running,
        httpx.AsyncClient(base_url=running.http_url, trust_env=False, timeout=60) as client,
    ):
        yield client


def body(*values: float) -> dict[str, Any]:
    data = list(values)
    return {
        "inputs": [{"name": "INPUT0", "shape": [1, len(data)], "datatype": "FP32", "data": data}]
    }


async def job_markers(client: redis.asyncio.Redis, settings: PlazaSettings) -> int:
    return len([k async for k in client.scan_iter(match=settings.names.job_key("*"), count=1000)])


async def readiness(http: httpx.AsyncClient) -> tuple[int, list[str]]:
    response = await http.get("/v2/health/ready")
    return response.status_code, list(response.json()["reasons"])


async def kafka_named_not_ready(http: httpx.AsyncClient) -> bool:
    status, reasons = await readiness(http)
    return status == 503 and any(r.startswith("Kafka did not answer") for r in reasons)


async def is_ready(http: httpx.AsyncClient) -> bool:
    return (await readiness(http))[0] == 200


async def job_done(http: httpx.AsyncClient, job_id: str) -> bool:
    status: str = (await http.get(f"/v2/jobs/{job_id}")).json()["status"]
    return status != "pending"


@pytest.mark.timeout(400)
async def test_the_gateway_with_kafka_down_answers_503_and_is_not_ready(
    kafka_cluster_factory: Callable[..., KafkaCluster],
    redis_url: str,
    unique_id: str,
    redis_client: redis.asyncio.Redis,  # cleans this test's keys afterwards
    tmp_path: Path,
) -> None:
    cluster = kafka_cluster_factory(nodes=1)
    s = make_settings(
        cluster.bootstrap_servers,
        redis_url,
        unique_id,
        repository=only_identity(tmp_path),
        kafka={"request_timeout_ms": 4000},
    )
    async with serving(s) as http, running_worker(s, MODEL):
        await wait_for(lambda: is_ready(http), READY_S, "the gateway to be ready")
        answered = await http.post(f"/v2/models/{MODEL}/infer", json=body(1.0, 2.0))
        assert answered.status_code == 200, answered.text  # the broker is up: a real answer
        markers = await job_markers(redis_client, s)

        cluster.stop_node(0)
        sync, job = await asyncio.gather(  # at once: each waits out the request timeout
            http.post(f"/v2/models/{MODEL}/infer", json=body(3.0)),
            http.post(f"/v2/models/{MODEL}/jobs", json=body(4.0)),
        )
        for response in (sync, job):
            assert response.status_code == 503, response.text
            error = response.json()
            assert error["code"] == "unavailable" and "job_id" not in error
            assert error["error"]  # a message a person can read, not an empty body
        assert await job_markers(redis_client, s) == markers  # no job that Kafka never took
        await wait_for(lambda: kafka_named_not_ready(http), 30, "readiness to name Kafka")
        assert (await http.get("/v2/health/live")).status_code == 200  # down is not dead

        cluster.start_node(0)
        await cluster.wait_ready_async()
        await wait_for(lambda: is_ready(http), READY_S, "the gateway to be ready again")
        accepted = await http.post(f"/v2/models/{MODEL}/jobs", json=body(5.0, 6.0))
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        await wait_for(lambda: job_done(http, job_id), READY_S, "the job to be answered")
        done = (await http.get(f"/v2/jobs/{job_id}")).json()
        assert done["status"] == "done" and done["outputs"][0]["data"] == [5.0, 6.0]
