"""Async jobs of a model whose first load the hosts refuse, on real Kafka and Redis.

A sync request that waits for such a model gets 404 model_not_found (naming the refusal) as
soon as the gateway knows no worker will ever answer it (``test_refusal_inflight.py``). A
job's client does not wait: it polls. So a job accepted before the refusal polls as that
same error from then on instead of as ``pending`` for the whole life of its marker, and a
job that passed the model's lookup just before the refusal is refused at submit, as a sync
request on its way is. No host runs here: the refusal is written to the model table as a
host writes it (``ModelTable.fail``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from plaza.contract import InferRequest
from plaza.errors import ModelNotFound
from plaza.gateway.service import GatewayService
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from tests.support import explicit_sim_settings, gateway_fronts, wait_for

pytestmark = pytest.mark.timeout(180)

MODEL = "sim"
REASON = "latency_a_us must be a number"


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit, ``sim`` (simulated, 16 values a row), no metrics port."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    gateway = made.gateway.model_copy(update={"metrics_port": -1})
    return made.model_copy(update={"gateway": gateway})


def http_body(value: float) -> dict[str, Any]:
    row = [value] * 16
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": row}]}


def request(value: float) -> InferRequest:
    data = Tensor.from_numpy("INPUT0", np.full((1, 16), value, dtype=np.float32))
    return InferRequest(uuid.uuid4().hex, MODEL, "", (data,))


async def refuse(redis_client: Any, settings: PlazaSettings, service: GatewayService) -> None:
    """Write the hosts' refusal of the model's load and wait until the gateway settled it
    (it no longer serves the model) and its answering pass is over."""
    table = ModelTable(redis_client, settings.names)
    loaded = await table.get(MODEL)
    assert loaded is not None
    assert await table.fail(loaded, REASON)
    await wait_for(
        lambda: MODEL not in service.models and not service._answering,
        what="the refusal settled and its answering pass done",
    )


async def test_a_job_accepted_before_the_refusal_polls_as_the_sync_error(
    settings: PlazaSettings, redis_client: Any
) -> None:
    async with (
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        await gw.service.registry.load(MODEL)  # a first load: served at once, no worker yet
        accepted = await http.post(f"/v2/models/{MODEL}/jobs", json=http_body(1.0))
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        assert (await http.get(f"/v2/jobs/{job_id}")).json()["status"] == "pending"

        await refuse(redis_client, settings, gw.service)

        sync = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(2.0))
        assert sync.status_code == 404, sync.text
        assert REASON in sync.json()["error"]
        polled = await http.get(f"/v2/jobs/{job_id}")
        assert polled.status_code == 200, polled.text
        job = polled.json()
        assert job["status"] == "error", job
        assert job["code"] == sync.json()["code"] == "model_not_found"
        assert job["error"] == sync.json()["error"]
        # stored as a worker stores an answer: a worker that fetched the job later skips it
        assert await redis_client.exists(settings.names.result_key(job_id))

        late = await http.post(f"/v2/models/{MODEL}/jobs", json=http_body(3.0))
        assert late.status_code == 404, late.text
        assert late.json() == sync.json()


async def test_a_job_on_its_way_past_the_lookup_is_refused_at_submit(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """A job that passed the model's lookup but was still in its backlog check when the
    refusal's answering pass ran is refused before it is published, as a sync request is."""
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
        sent = request(2.0)
        task = asyncio.create_task(service.submit(sent))
        await entered.wait()
        await refuse(redis_client, settings, service)
        release.set()
        with pytest.raises(ModelNotFound, match=REASON):
            await asyncio.wait_for(task, 60)
        assert not await redis_client.exists(settings.names.job_key(sent.id))


async def test_a_job_of_a_model_unloaded_is_left_to_its_workers(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """An unload is no refusal: the model's workers answer what is queued before they stop,
    so its jobs poll as pending until they do (only a refused model's are answered here)."""
    async with gateway_fronts(settings) as gw:
        service = gw.service
        await service.registry.load(MODEL)
        job_id = await service.submit(request(1.0))
        await service.unload_model(MODEL)
        assert MODEL not in service.models
        assert (await service.poll(job_id)).state == "pending"
        assert not await redis_client.exists(settings.names.result_key(job_id))


async def test_a_gateway_started_after_the_refusal_polls_the_job_as_refused(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """The refusal is news to a gateway that starts after it (its registry's first follow
    settles it, before its producer exists): a job submitted through another gateway before
    the refusal polls there as refused too."""
    async with gateway_fronts(settings) as gw:
        await gw.service.registry.load(MODEL)
        job_id = await gw.service.submit(request(1.0))
        await refuse(redis_client, settings, gw.service)
        assert not await redis_client.exists(settings.names.result_key(job_id))  # not polled
    late = GatewayService(settings)
    try:
        await late.start()
        assert MODEL not in late.models
        await wait_for(lambda: not late._answering, what="the late gateway's answering pass")
        status = await late.poll(job_id)
        assert status.state == "done", status
        assert status.result is not None and status.result.error is not None
        assert status.result.error.code == "model_not_found"
        assert REASON in status.result.error.message
    finally:
        await late.stop()
