"""Requests waiting for a model whose first load the hosts refuse, on real Kafka and Redis.

A gateway serves a model loaded for the first time at once: its requests wait in Kafka for
its first worker. When the hosts refuse that load and no worker of the model lives at all,
the gateway stops serving it (404 model_not_found naming the refusal); the requests it
accepted before then, which no worker will ever answer, get that same error at once, and
their job says so, instead of waiting out their whole time. No host runs here: the refusal
is written to the model table as a host writes it (``ModelTable.fail``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from plaza.contract import InferRequest, InferResult
from plaza.errors import ModelNotFound
from plaza.gateway.service import GatewayService
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from tests.support import explicit_sim_settings, gateway_fronts, wait_for

pytestmark = pytest.mark.timeout(180)

MODEL = "sim"
WAIT_S = 90.0
"""How long each request may wait for its answer: far longer than the test takes when
the refusal answers it (without that, each would end as a timeout, not model_not_found)."""


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit, ``sim`` (simulated, 16 values a row), sync calls waiting ``WAIT_S``."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    gateway = made.gateway.model_copy(update={"sync_timeout_s": WAIT_S, "metrics_port": -1})
    return made.model_copy(update={"gateway": gateway})


def http_body(value: float) -> dict[str, Any]:
    row = [value] * 16
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": row}]}


async def streamed(service: GatewayService, req: InferRequest) -> list[InferResult]:
    """Every response of ``req`` through the service's stream (errors are yielded)."""
    return [result async for result in service.infer_stream(req)]


def request(value: float) -> InferRequest:
    data = Tensor.from_numpy("INPUT0", np.full((1, 16), value, dtype=np.float32))
    return InferRequest(uuid.uuid4().hex, MODEL, "", (data,))


async def test_requests_waiting_for_a_refused_first_load_are_answered_at_once(
    settings: PlazaSettings, redis_client: Any
) -> None:
    async with (
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=WAIT_S + 30) as http,
    ):
        service = gw.service
        await service.registry.load(MODEL)  # a first load: served at once, no worker yet
        sent = request(1.0)
        by_service = asyncio.create_task(service.infer(sent))
        by_http = asyncio.create_task(http.post(f"/v2/models/{MODEL}/infer", json=http_body(2.0)))
        by_stream = asyncio.create_task(streamed(service, request(4.0)))
        mux = await service.producer.replies()
        await wait_for(lambda: mux.waiting == 3, what="the three requests published and waiting")

        table = ModelTable(redis_client, settings.names)
        loaded = await table.get(MODEL)
        assert loaded is not None
        assert await table.fail(loaded, "latency_a_us must be a number")  # as a host reports

        with pytest.raises(ModelNotFound) as refused:
            await by_service
        assert "could not load it" in refused.value.message
        assert "latency_a_us" in refused.value.message
        answer = await by_http
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "model_not_found"
        assert "latency_a_us" in answer.json()["error"]
        [response] = await by_stream
        assert response.error is not None and response.final
        assert response.error.code == "model_not_found"
        assert response.error.message == answer.json()["error"]

        # the same error a new request gets
        late = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(3.0))
        assert late.status_code == 404, late.text
        assert late.json()["error"] == answer.json()["error"]

        # and its job says so (a worker that fetched it later would skip it: answered)
        job = (await http.get(f"/v2/jobs/{sent.id}")).json()
        assert job["status"] == "error", job
        assert job["code"] == "model_not_found"
        assert job["error"] == answer.json()["error"]


async def test_requests_of_a_model_a_live_worker_serves_are_left_to_it(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """A refused load of a model whose worker of another generation still lives answers
    nothing: that worker may still answer what waits (a plain worker's entry, naming no
    generation, stands for one here)."""
    async with gateway_fronts(settings) as gw:
        service = gw.service
        await service.registry.load(MODEL)
        names = settings.names
        await redis_client.zadd(names.worker_registry_key(MODEL), {"plain": 2e10})
        await redis_client.set(names.worker_info_key("plain"), '{"model": "sim"}', ex=600)
        waiting = asyncio.create_task(service.infer(request(1.0), timeout_s=WAIT_S))
        mux = await service.producer.replies()
        await wait_for(lambda: mux.waiting == 1, what="the request published and waiting")
        table = ModelTable(redis_client, settings.names)
        loaded = await table.get(MODEL)
        assert loaded is not None
        assert await table.fail(loaded, "latency_a_us must be a number")
        await wait_for(lambda: MODEL in service.registry.refused, what="the refusal followed")
        await service.registry.follow()  # its refusal settled: a live worker, still served
        assert MODEL in service.models
        assert not waiting.done()
        assert mux.waiting == 1
        waiting.cancel()


async def test_a_request_on_its_way_past_the_lookup_gets_the_refusal_too(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """A request that passed the model's lookup but was still in its backlog check (a
    Kafka lag probe, for a model with max_queue_size) when the refusal's answering pass ran
    is refused where it would start waiting, not left to wait out its time."""
    async with gateway_fronts(settings) as gw:
        service = gw.service
        await service.registry.load(MODEL)
        producer = service.producer
        entered, release = asyncio.Event(), asyncio.Event()
        check_queue = producer._check_queue

        async def held_check(*args: Any, **kwargs: Any) -> None:
            entered.set()
            await release.wait()
            await check_queue(*args, **kwargs)

        producer._check_queue = held_check  # type: ignore[method-assign]
        task = asyncio.create_task(service.infer(request(2.0)))
        await entered.wait()
        table = ModelTable(redis_client, settings.names)
        loaded = await table.get(MODEL)
        assert loaded is not None and await table.fail(loaded, "bad config")
        await wait_for(
            lambda: MODEL not in service.models and not service._answering,
            what="the refusal settled and its answering pass done",
        )
        release.set()
        with pytest.raises(ModelNotFound, match="bad config"):
            await asyncio.wait_for(task, WAIT_S / 2)
