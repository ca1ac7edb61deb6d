"""The response cache on real Kafka and Redis: a repeated request never reaches Kafka.

A test-owned repository serves ``cached`` (the identity model with ``response_cache
{ enable: true }``) and ``plain`` (the same model without it). Records are counted on each
model's request topic (the sum of its partitions' end offsets) before and after a call,
through the gateway (HTTP) and through the SDK; the gateway's nv_cache_* counters move with
the hits and misses, and so do ``cache_hit`` / ``cache_miss`` in the statistics API; and
the bounds (slots, entry size, TTL) hold in Redis.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis.asyncio
from aiokafka import TopicPartition
from msgspec.structs import replace

from plaza.client import PlazaClient, make_request
from plaza.connections import kafka_consumer
from plaza.contract import ErrorInfo, InferResult
from plaza.errors import DeadlineExceeded
from plaza.gateway.app import create_app
from plaza.gateway.service import GatewayService
from plaza.metrics import render
from plaza.modelconfig import load_model_config
from plaza.response_cache import ResponseCache
from plaza.settings import PlazaSettings, ResponseCacheSettings
from plaza.stack.redis_server import RedisServer
from plaza.tensors import Tensor
from tests.metrics_support import samples, value
from tests.support import REPOSITORY, make_settings, running_worker, wait_for

CACHED, PLAIN = "cached", "plain"


def repository(root: Path) -> Path:
    """``cached`` and ``plain``: identity's model file, its config with and without the cache."""
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    for name, extra in ((CACHED, "\nresponse_cache { enable: true }\n"), (PLAIN, "")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").symlink_to(REPOSITORY / "identity/1/model.onnx")
        text = config.replace('name: "identity"', f'name: "{name}"')
        (root / name / "config.pbtxt").write_text(text + extra)
    return root


@pytest.fixture
def cache_settings(settings: PlazaSettings, tmp_path: Path, redis_client: Any) -> PlazaSettings:
    return settings.model_copy(update={"repository": repository(tmp_path / "repo")})


class TopicCounter:
    """Records published so far to a model's request topic (end offsets summed)."""

    def __init__(self, settings: PlazaSettings) -> None:
        self._settings = settings
        self._consumer = kafka_consumer(settings.kafka, f"{settings.kafka.topic_prefix}counter")

    async def __aenter__(self) -> TopicCounter:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def records(self, model: str) -> int:
        topic = self._settings.names.request_topic(model)
        parts = [
            TopicPartition(topic, p) for p in range(self._settings.kafka.partitions)
        ]  # the topics exist: the gateway or the worker made them
        ends = await self._consumer.end_offsets(parts)
        return sum(ends.values())


@asynccontextmanager
async def stack(s: PlazaSettings) -> AsyncIterator[tuple[GatewayService, httpx.AsyncClient]]:
    """Workers of both models and the gateway's app in process (no sockets)."""
    async with running_worker(s, CACHED), running_worker(s, PLAIN):
        service = GatewayService(s)
        await service.start()
        try:
            transport = httpx.ASGITransport(app=create_app(s, service))
            async with httpx.AsyncClient(transport=transport, base_url="http://plaza") as http:
                yield service, http
        finally:
            await service.stop()


def body(request_id: str, *values: float) -> dict[str, Any]:
    data = list(values)
    tensor = {"name": "INPUT0", "shape": [1, len(data)], "datatype": "FP32", "data": data}
    return {"id": request_id, "inputs": [tensor], "parameters": {"mode": "x"}}


def cache_counts(service: GatewayService, model: str) -> tuple[float | None, float | None]:
    found = samples(render(service.metrics.registry).decode())
    return (
        value(found, "nv_cache_num_hits_per_model", model=model, version="1"),
        value(found, "nv_cache_num_misses_per_model", model=model, version="1"),
    )


@pytest.mark.timeout(180)
async def test_http_second_identical_request_is_answered_from_redis_unpublished(
    cache_settings: PlazaSettings,
) -> None:
    s = cache_settings
    async with stack(s) as (service, http), TopicCounter(s) as topic:
        path = f"/v2/models/{CACHED}/infer"
        first = await http.post(path, json=body("first", 1.5, 2.5))
        assert first.status_code == 200, first.text
        assert await topic.records(CACHED) == 1
        assert cache_counts(service, CACHED) == (None, 1.0)

        again = await http.post(path, json=body("again", 1.5, 2.5))
        assert again.status_code == 200, again.text
        assert await topic.records(CACHED) == 1  # never reached Kafka
        assert again.json() == {**first.json(), "id": "again"}  # outputs, model_version
        assert first.json()["id"] == "first"
        assert cache_counts(service, CACHED) == (1.0, 1.0)
        found = samples(render(service.metrics.registry).decode())
        miss_us = value(found, "nv_cache_miss_duration_per_model", model=CACHED, version="1")
        assert miss_us is not None and miss_us > 0

        other = await http.post(path, json=body("other", 1.5, 2.6))  # other bytes: a miss
        assert other.json()["outputs"][0]["data"] == pytest.approx([1.5, 2.6])
        v1 = await http.post(f"/v2/models/{CACHED}/versions/1/infer", json=body("v1", 1.5, 2.5))
        assert v1.json() == {**first.json(), "id": "v1"}  # version 1 is the default: a hit
        params = {**body("p", 1.5, 2.5), "parameters": {"mode": "y"}}
        await http.post(path, json=params)  # another parameter: a miss
        assert await topic.records(CACHED) == 3
        assert cache_counts(service, CACHED) == (2.0, 3.0)

        async def stats() -> dict[str, Any]:
            doc = (await http.get(f"/v2/models/{CACHED}/stats")).json()
            inference: dict[str, Any] = doc["model_stats"][0]["inference_stats"]
            return inference

        async def counted() -> bool:  # worker heartbeats and the producer's flushes
            found = await stats()
            counts = [found[p]["count"] for p in ("cache_hit", "cache_miss", "success")]
            return counts == [2, 3, 5]  # success: 3 computed by the worker + 2 hits

        await wait_for(counted, 30, "cache_hit and cache_miss in the statistics")
        assert (await stats())["cache_hit"]["ns"] > 0

        for i in range(3):
            plain = await http.post(f"/v2/models/{PLAIN}/infer", json=body(f"p{i}", 1.5, 2.5))
            assert plain.status_code == 200, plain.text
        assert await topic.records(PLAIN) == 3  # no cache: published every time
        assert cache_counts(service, PLAIN) == (None, None)


@pytest.mark.timeout(180)
async def test_sdk_hits_skip_kafka_and_errors_are_never_cached(
    cache_settings: PlazaSettings,
) -> None:
    s = cache_settings
    x = {"INPUT0": np.array([[3.0, 4.0, 5.0]], np.float32)}
    async with stack(s), PlazaClient(s) as sdk, TopicCounter(s) as topic:
        first = await sdk.infer(CACHED, x, correlation_id="sdk-1")
        again = await sdk.infer(CACHED, x, correlation_id="sdk-2")
        assert await topic.records(CACHED) == 1
        assert (again.id, again.model, again.version) == ("sdk-2", CACHED, "1")
        assert again.outputs == first.outputs  # the same bytes, dtype and shape
        assert (sdk.producer.cache.hits, sdk.producer.cache.misses) == (1, 1)

        # The SDK does not validate: the worker refuses INT32 and its error is the answer.
        wrong = {"INPUT0": np.array([[3, 4, 5]], np.int32)}
        for _ in range(2):
            failed = await sdk.infer(CACHED, wrong, raise_on_error=False)
            assert failed.error is not None
        assert await topic.records(CACHED) == 3  # the error was not cached
        assert sdk.producer.cache.misses == 3

        for _ in range(2):
            await sdk.infer(PLAIN, x)
        assert await topic.records(PLAIN) == 2


async def test_bounds_hold_in_redis(
    cache_settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    """At most max_entries keys per model, nothing over max_entry_bytes, each with a TTL."""
    bounds = ResponseCacheSettings(ttl_s=30, max_entries=4, max_entry_bytes=4096)
    s = cache_settings.model_copy(update={"response_cache": bounds})
    spec = load_model_config(s.repository / CACHED / "config.pbtxt")
    cache = ResponseCache(redis_client, bounds, s.names, lambda _: "1")
    for i in range(40):
        req = make_request(CACHED, {"INPUT0": np.full((1, 2), i, np.float32)})
        probe = await cache.probe(req, spec)
        assert probe is not None and probe.hit is None
        out = Tensor.from_numpy("OUTPUT0", np.full((1, 2), i, np.float32))
        result = InferResult(req.id, CACHED, "1", (out,))
        await cache.store(probe, result)
    pattern = s.names.response_cache_key(CACHED, 0).removesuffix("0") + "*"
    keys = [k async for k in redis_client.scan_iter(match=pattern)]
    assert 1 < len(keys) <= 4
    for key in keys:
        assert 0 < await redis_client.ttl(key) <= 30
    hit = (await cache.probe(req, spec)).hit  # type: ignore[union-attr]  # the last one
    assert hit is not None and hit.outputs[0].to_numpy().tolist() == [[39.0, 39.0]]
    # the SDK passes a version as written: "01" is version 1, its entry and its statistics
    spelled = await cache.probe(replace(req, version="01"), spec)
    assert spelled is not None and spelled.version == "1" and spelled.hit is not None

    big = make_request(CACHED, {"INPUT0": np.zeros((1, 2048), np.float32)})  # 8 KiB answer
    probe = await cache.probe(big, spec)
    assert probe is not None
    await cache.store(probe, InferResult(big.id, CACHED, "1", big.inputs))
    assert (await cache.probe(big, spec)).hit is None  # type: ignore[union-attr]

    plain = load_model_config(s.repository / PLAIN / "config.pbtxt")
    assert await cache.probe(replace(big, model=PLAIN), plain) is None  # not opted in
    assert await cache.probe(replace(big, version="latest"), spec) is None  # no such version

    error = make_request(CACHED, {"INPUT0": np.ones((1, 2), np.float32)})
    probe = await cache.probe(error, spec)
    assert probe is not None
    await cache.store(probe, InferResult(error.id, CACHED, "1", error=ErrorInfo("x", "boom")))
    assert (await cache.probe(error, spec)).hit is None  # type: ignore[union-attr]


@pytest.mark.timeout(180)
async def test_streamed_calls_are_looked_up_and_stored_as_sync_ones(
    cache_settings: PlazaSettings,
) -> None:
    """Triton caches any request to a model that is not decoupled, streamed or not: gRPC's
    ModelStreamInfer and generate_stream go through ``infer_stream``."""
    s = cache_settings
    x = {"INPUT0": np.array([[1.0, 2.0]], np.float32)}
    async with stack(s) as (service, _), TopicCounter(s) as topic:
        answers = []
        for i in range(3):
            stream = service.infer_stream(make_request(CACHED, x, correlation_id=f"s{i}"))
            async with aclosing(stream) as responses:
                answers += [r async for r in responses]
        assert await topic.records(CACHED) == 1  # the first was computed, two were hits
        assert [(r.id, r.final, r.error) for r in answers] == [
            (f"s{i}", True, None) for i in range(3)
        ]
        assert answers[1].outputs == answers[2].outputs == answers[0].outputs
        assert cache_counts(service, CACHED) == (2.0, 1.0)
        sync = await service.infer(make_request(CACHED, x, correlation_id="sync"))
        assert sync.outputs == answers[0].outputs  # the stream's answer, stored
        assert await topic.records(CACHED) == 1


@pytest.mark.timeout(180)
async def test_a_staged_version_folder_does_not_move_the_default_version(
    cache_settings: PlazaSettings,
) -> None:
    """A request without a version is answered by the newest loaded version, and looked up
    under it: a version folder staged but not loaded (model_control none) does not make
    every such lookup miss, nor count misses under a version that is not loaded."""
    s = cache_settings
    async with stack(s) as (service, http), TopicCounter(s) as topic:
        (s.repository / CACHED / "2").mkdir()
        (s.repository / CACHED / "2" / "model.onnx").symlink_to(
            REPOSITORY / "identity/1/model.onnx"
        )
        assert service.model(CACHED).versions == (1,)
        for i in range(3):
            r = await http.post(f"/v2/models/{CACHED}/infer", json=body(f"u{i}", 3.0, 4.0))
            assert r.status_code == 200, r.text
            assert r.json()["model_version"] == "1"
        assert await topic.records(CACHED) == 1
        assert cache_counts(service, CACHED) == (2.0, 1.0)
        found = samples(render(service.metrics.registry).decode())
        assert value(found, "nv_cache_num_misses_per_model", model=CACHED, version="2") is None


@pytest.mark.timeout(120)
async def test_a_cached_call_ends_within_its_timeout_when_redis_stops_answering(
    kafka_bootstrap: str,
    unique_id: str,
    tmp_path: Path,
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """A Redis that takes commands and never answers (frozen, SIGSTOP) holds the cache
    lookup: the call ends at its own timeout as DeadlineExceeded (a 504), with no job,
    since nothing was published."""
    server = redis_server_factory()
    s = make_settings(
        kafka_bootstrap, server.url, unique_id, repository=repository(tmp_path / "repo")
    )
    x = {"INPUT0": np.array([[1.0, 2.0]], np.float32)}
    async with stack(s) as (service, _), TopicCounter(s) as topic:
        await service.infer(make_request(CACHED, {"INPUT0": np.array([[9.0]], np.float32)}))
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            call = service.infer(make_request(CACHED, x), timeout_s=1.0)
            with pytest.raises(DeadlineExceeded, match="response cache lookup") as info:
                await asyncio.wait_for(call, 60)  # a guard only: it was blocked for good
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert info.value.code == "timeout" and "job_id" not in info.value.details
        assert await topic.records(CACHED) == 1  # the warm-up call's only
