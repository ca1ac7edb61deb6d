"""A reload the model hosts refuse, as the gateway serves it, on real Kafka and Redis.

A model host keeps the old generation's unit serving when a reload's new config fails where
the backend is made (``workers/model_watch.py``). Triton does the same and keeps the old
model's config for everything: metadata, config, the validation of requests, and a READY
row in the repository index. The refused config here reshapes ``sim`` (16 values a row to
8) and gives it a latency the simulated backend refuses, so a request shows which config
the gateway validates it against.

The end-to-end test runs a gateway (both fronts) and a host; the other follows the model
table with a second gateway's registry and no host, the worker of the old generation being
its registry entry, written as a worker heartbeats (real Redis).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from plaza.gateway.registry import ModelRegistry
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from tests.integration.test_model_control_triton import gateway_and_host
from tests.support import explicit_sim_settings

pytestmark = pytest.mark.timeout(180)

MODEL = "sim"


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit, ``sim`` (simulated, 16 values a row) in a repository of its own."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    wide = made.gateway.model_copy(update={"load_timeout_s": 60.0, "metrics_port": -1})
    return made.model_copy(update={"gateway": wide})


def reshaped(config: dict[str, Any], width: int, latency_a_us: str = "1000") -> str:
    """``config`` (Triton's JSON form) with INPUT0 and OUTPUT0 ``width`` values a row; a
    latency that is no number makes the simulated backend refuse it (the gateway reads it)."""
    return json.dumps(
        {
            **config,
            "input": [{**config["input"][0], "dims": [width]}],
            "output": [{**config["output"][0], "dims": [width]}],
            "parameters": {"latency_a_us": {"string_value": latency_a_us}},
        }
    )


def dims(config: dict[str, Any]) -> tuple[list[int], list[int]]:
    return config["input"][0]["dims"], config["output"][0]["dims"]


def http_body(width: int, value: float) -> dict[str, Any]:
    row = [value] * width
    return {"inputs": [{"name": "INPUT0", "shape": [1, width], "datatype": "FP32", "data": row}]}


def grpc_inputs(width: int, value: float) -> list[aioclient.InferInput]:
    item = aioclient.InferInput("INPUT0", [1, width], "FP32")
    item.set_data_from_numpy(np.full((1, width), value, dtype=np.float32))
    return [item]


async def index_row(http: httpx.AsyncClient) -> dict[str, Any]:
    rows = (await http.post("/v2/repository/index")).json()
    [row] = [r for r in rows if r["name"] == MODEL]
    return dict(row)


async def test_a_refused_reload_leaves_the_old_config_served_through_both_fronts(
    settings: PlazaSettings,
) -> None:
    async with (
        gateway_and_host(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=150) as http,
    ):
        grpc = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            assert (await http.post(f"/v2/repository/models/{MODEL}/load")).status_code == 200
            config = (await http.get(f"/v2/models/{MODEL}/config")).json()
            assert dims(config) == ([16], [16])

            body = {"parameters": {"config": reshaped(config, 8, latency_a_us="abc")}}
            answer = await http.post(f"/v2/repository/models/{MODEL}/load", json=body)
            assert answer.status_code == 400, answer.text
            assert answer.json()["code"] == "bad_config"

            # The old config is served: config, metadata and validation alike.
            assert dims((await http.get(f"/v2/models/{MODEL}/config")).json()) == ([16], [16])
            metadata = (await http.get(f"/v2/models/{MODEL}")).json()
            assert metadata["inputs"][0]["shape"] == [-1, 16]
            grpc_config = await grpc.get_model_config(MODEL, as_json=True)
            assert grpc_config["config"]["input"][0]["dims"] == ["16"]
            answered = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(16, 3.0))
            assert answered.status_code == 200, answered.text
            assert answered.json()["outputs"][0]["shape"] == [1, 16]
            assert answered.json()["outputs"][0]["data"] == [3.0] * 16
            result = await grpc.infer(MODEL, grpc_inputs(16, 5.0))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 5.0))
            refused = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(8, 1.0))
            assert refused.status_code == 400, refused.text
            assert refused.json()["code"] == "invalid_input"
            with pytest.raises(InferenceServerException) as invalid:
                await grpc.infer(MODEL, grpc_inputs(8, 1.0))
            assert invalid.value.status() == "StatusCode.INVALID_ARGUMENT"

            row = await index_row(http)
            assert row["state"] == "READY"  # Triton's: the old generation serves on
            assert "refused" in row["reason"] and "latency_a_us" in row["reason"]
            assert await grpc.is_model_ready(MODEL)

            # A good reload moves everything to its config, as any reload.
            body = {"parameters": {"config": reshaped(config, 8)}}
            answer = await http.post(f"/v2/repository/models/{MODEL}/load", json=body)
            assert answer.status_code == 200, answer.text
            assert dims((await http.get(f"/v2/models/{MODEL}/config")).json()) == ([8], [8])
            answered = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(8, 2.0))
            assert answered.status_code == 200, answered.text
            assert answered.json()["outputs"][0]["data"] == [2.0] * 8
            result = await grpc.infer(MODEL, grpc_inputs(8, 4.0))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 8), 4.0))
            row = await index_row(http)
            assert row["state"] == "READY" and not row.get("reason"), row
        finally:
            await grpc.close()


# -- a gateway that follows the table (no host: the old worker is its registry entry) --------


async def heartbeat(
    redis: aioredis.Redis, settings: PlazaSettings, worker_id: str, generation: int
) -> None:
    """A live registry entry of ``sim`` naming ``generation``, as a worker's heartbeat writes."""
    names = settings.names
    await redis.zadd(names.worker_registry_key(MODEL), {worker_id: time.time() + 600})
    info = {"model": MODEL, "generation": generation}
    await redis.set(names.worker_info_key(worker_id), json.dumps(info), ex=600)


def served_dims(registry: ModelRegistry) -> list[int]:
    return list(registry.models[MODEL].spec.inputs[0].dims)


async def test_a_following_gateway_serves_the_config_a_live_worker_still_runs(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """``following`` follows the refused generation before the hosts refuse it and after
    (the config a live worker runs comes back); ``behind`` follows it only once refused
    (it keeps serving the old config); one started after the refusal read no older config
    (its index row names the refusal); a good load moves them all on."""
    table = ModelTable(redis_client, settings.names)
    loading, following, behind = (ModelRegistry(settings) for _ in range(3))
    for registry in (loading, following, behind):
        registry.read_start_models()
        await registry.start(redis_client)
    config = settings_config(loading)
    await loading.load(MODEL)
    first = await table.get(MODEL)
    assert first is not None
    await heartbeat(redis_client, settings, "old", first.generation)
    for registry in (following, behind):
        await registry.follow()
        assert served_dims(registry) == [16]

    await loading.load(MODEL, reshaped(config, 8, latency_a_us="abc"))
    await following.follow()  # the new generation, not refused yet: no worker of it is live
    assert served_dims(following) == [16]
    refused = await table.get(MODEL)
    assert refused is not None
    assert await table.fail(refused, "latency_a_us must be a number")  # as a host reports
    for registry in (following, loading, behind):
        await registry.follow()
        assert served_dims(registry) == [16]
        [row] = [r for r in registry.index({MODEL: 1}) if r.name == MODEL]
        assert row.state == "READY" and "refused" in row.reason, row

    late = ModelRegistry(settings)  # read no older config: the refusal is all it can tell
    late.read_start_models()
    await late.start(redis_client)
    [row] = [r for r in late.index({MODEL: 1}) if r.name == MODEL]
    assert row.state == "READY" and "refused" in row.reason, row

    await loading.load(MODEL, reshaped(config, 4))
    third = await table.get(MODEL)
    assert third is not None
    await heartbeat(redis_client, settings, "newest", third.generation)  # its worker is up
    for registry in (loading, following, behind, late):
        await registry.follow()
        assert served_dims(registry) == [4]
        assert [r.reason for r in registry.index({MODEL: 1}) if r.name == MODEL] == [""]


def settings_config(registry: ModelRegistry) -> dict[str, Any]:
    """``sim``'s config as the repository holds it (Triton's JSON form)."""
    return registry.repo.spec(MODEL).config_json()
