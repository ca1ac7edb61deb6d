"""The repository API against Triton's own rules, on real Kafka and Redis.

- Parameters of the wrong type are refused (HTTP's ``ready``, gRPC's ``unload_dependents``)
  rather than read as something else.
- Ensembles unload as Triton's model repository manager unloads them: unloading a model
  unloads the loaded ensembles that run it (directly or through another ensemble), and
  ``unload_dependents`` on an ensemble unloads its step models that were loaded only along
  with it (not named by a load, not run by another loaded ensemble).

The table-level tests run gateways' registries with no workers (``explicit_sim_settings``);
the end-to-end one serves a gateway (both fronts) and a host that follows the model table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient
from grpc import StatusCode
from grpc import aio as grpc_aio
from tritonclient.grpc import service_pb2 as pb

from plaza.gateway.main import Serving, serving
from plaza.gateway.registry import ModelRegistry
from plaza.model_control import ModelTable, serves_generation
from plaza.settings import PlazaSettings
from plaza.workers.host import Host
from tests.integration.test_host_follow import following
from tests.support import explicit_sim_settings, wait_for
from tests.unit.test_registry import _ensemble

pytestmark = pytest.mark.timeout(180)

Starter = Callable[[], Awaitable[ModelRegistry]]


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit; ``sim`` and its copy ``sim2`` (simulated models), and ensembles:
    ``inner`` runs sim, ``outer`` runs inner, ``share`` runs sim, ``keep`` runs sim2."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    root = Path(made.repository)
    shutil.copytree(root / "sim", root / "sim2")
    config = (root / "sim2" / "config.pbtxt").read_text().replace('"sim"', '"sim2"')
    (root / "sim2" / "config.pbtxt").write_text(config)
    for name, step in (("inner", "sim"), ("outer", "inner"), ("share", "sim"), ("keep", "sim2")):
        _ensemble(root, name, step)
    return made


@pytest.fixture
def gateways(settings: PlazaSettings, redis_client: aioredis.Redis) -> Starter:
    async def started() -> ModelRegistry:
        registry = ModelRegistry(settings)
        registry.read_start_models()
        await registry.start(redis_client)
        return registry

    return started


async def loaded(redis_client: aioredis.Redis, settings: PlazaSettings) -> set[str]:
    table = await ModelTable(redis_client, settings.names).read()
    return {name for name, desired in table.items() if desired.loaded}


# -- ensembles (the model table, no workers) ---------------------------------------------------


async def test_unloading_a_step_model_unloads_the_ensembles_that_run_it(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter
) -> None:
    gateway, other = await gateways(), await gateways()
    await gateway.load("outer")
    await gateway.load("keep")
    assert await loaded(redis_client, settings) == {"outer", "inner", "sim", "keep", "sim2"}

    await gateway.unload("sim")  # no unload_dependents: the callers go all the same
    assert await loaded(redis_client, settings) == {"keep", "sim2"}
    assert {"sim", "inner", "outer"}.isdisjoint(gateway.models)
    index = {row.name: row for row in gateway.index({})}
    assert index["outer"].state == index["inner"].state == "UNAVAILABLE"
    await other.follow()
    assert {"sim", "inner", "outer"}.isdisjoint(other.models)
    assert {"keep", "sim2"} <= set(other.models)


async def test_unload_dependents_unloads_the_steps_loaded_only_along_with_an_ensemble(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter
) -> None:
    gateway = await gateways()
    await gateway.load("sim2")  # named by a load: no ensemble's unload takes it
    await gateway.load("keep")
    await gateway.load("outer")  # inner and sim loaded along with it
    await gateway.load("share")  # runs sim too
    table = await ModelTable(redis_client, settings.names).read()
    assert not table["inner"].explicit and not table["sim"].explicit
    assert table["sim2"].explicit and table["outer"].explicit

    await gateway.unload("outer", dependents=True)  # inner goes; sim stays: share runs it
    assert await loaded(redis_client, settings) == {"sim", "share", "sim2", "keep"}
    await gateway.unload("share", dependents=True)  # now nothing runs sim
    assert await loaded(redis_client, settings) == {"sim2", "keep"}
    await gateway.unload("keep", dependents=True)
    assert await loaded(redis_client, settings) == {"sim2"}
    assert set(gateway.models) == {"sim2"}

    await gateway.load("outer")
    await gateway.unload("outer")  # without unload_dependents its steps stay
    assert await loaded(redis_client, settings) == {"sim2", "inner", "sim"}


# -- end to end: a gateway and a host ----------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway_and_host(settings: PlazaSettings) -> AsyncIterator[Serving]:
    host = Host(following(settings))
    stop = asyncio.Event()
    await host.start()
    task = asyncio.create_task(host.run_until_stopped(stop))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        async with serving(settings, http_socket=sock, grpc_port=0) as gw:
            yield gw
    finally:
        stop.set()
        await task
        sock.close()


async def test_the_repository_api_refuses_wrong_types_and_unloads_an_ensembles_callers(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """Over HTTP and gRPC: a wrongly typed parameter is a 400 / INVALID_ARGUMENT that
    changes nothing; unloading an ensemble's step unloads the ensemble, so the server is
    ready again (it was not: the ensemble stayed loaded and could serve nothing)."""
    wide = settings.gateway.model_copy(update={"load_timeout_s": 120.0, "metrics_port": -1})
    settings = settings.model_copy(update={"gateway": wide})
    async with (
        gateway_and_host(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=150) as http,
    ):
        grpc = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            refused = await http.post("/v2/repository/index", json={"ready": "false"})
            assert refused.status_code == 400, refused.text
            assert refused.json()["code"] == "invalid_input"
            assert "'ready'" in refused.json()["error"]

            answer = await http.post("/v2/repository/models/inner/load")
            assert answer.status_code == 200, answer.text
            assert await grpc.is_server_ready()
            ready = (await http.post("/v2/repository/index", json={"ready": True})).json()
            assert {row["name"] for row in ready} == {"inner", "sim"}

            request = pb.RepositoryModelUnloadRequest(model_name="sim")
            request.parameters["unload_dependents"].string_param = "true"
            with pytest.raises(grpc_aio.AioRpcError) as caught:
                await grpc._client_stub.RepositoryModelUnload(request)
            assert caught.value.code() == StatusCode.INVALID_ARGUMENT
            assert "unload_dependents" in str(caught.value.details())
            assert await loaded(redis_client, settings) == {"inner", "sim"}

            await grpc.unload_model("sim")
            assert await loaded(redis_client, settings) == set()
            assert not await grpc.is_model_ready("inner")
            await wait_for(grpc.is_server_ready, 60, "the server to be ready again")
            index = {row["name"]: row for row in (await http.post("/v2/repository/index")).json()}
            assert index["inner"]["state"] == "UNAVAILABLE"
        finally:
            await grpc.close()


# -- reloads: answered once the new generation runs ----------------------------------------


async def test_a_load_answers_for_its_own_generation_and_a_refused_config_fails_at_once(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """A reload answers once a worker of its generation is live (not on the old worker's
    heartbeat); a config the gateway accepts and the worker refuses is a 400 bad_config
    with the host's reason, for a reload and a fresh load alike (not a 200, nor a 503 once
    load_timeout_s has passed); a load of what is loaded already keeps its generation."""
    wide = settings.gateway.model_copy(update={"load_timeout_s": 60.0, "metrics_port": -1})
    settings = settings.model_copy(update={"gateway": wide})
    table = ModelTable(redis_client, settings.names)

    async def serves(generation: int) -> bool:  # a reload's worker has an id of its own
        return await serves_generation(redis_client, settings.names, ["sim"], generation)

    async with (
        gateway_and_host(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=150) as http,
    ):
        assert (await http.post("/v2/repository/models/sim/load")).status_code == 200
        first = await table.get("sim")
        assert first is not None and await serves(first.generation)
        config = (await http.get("/v2/models/sim/config")).json()

        refused = {**config, "parameters": {"latency_a_us": {"string_value": "abc"}}}
        body = {"parameters": {"config": json.dumps(refused)}}
        answer = await http.post("/v2/repository/models/sim/load", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "bad_config"
        assert "latency_a_us" in answer.json()["error"]
        index = {row["name"]: row for row in (await http.post("/v2/repository/index")).json()}
        assert index["sim"]["state"] == "READY"  # Triton's: the old generation serves on

        fresh = {**refused, "name": "sim2"}
        body = {"parameters": {"config": json.dumps(fresh)}}
        answer = await http.post("/v2/repository/models/sim2/load", json=body)
        assert answer.status_code == 400, answer.text
        assert "latency_a_us" in answer.json()["error"]
        # no worker of it at all: it is not served (Triton serves no model that failed to
        # load), so a request is refused at once instead of waiting in Kafka for none
        late = await http.post("/v2/models/sim2/infer", json={"inputs": []})
        assert late.status_code == 404, late.text
        assert late.json()["code"] == "model_not_found"
        assert "could not load it" in late.json()["error"]
        index = {row["name"]: row for row in (await http.post("/v2/repository/index")).json()}
        assert index["sim2"]["state"] == "UNAVAILABLE"
        assert "latency_a_us" in index["sim2"]["reason"]

        smaller = json.dumps({**config, "max_batch_size": 8})
        body = {"parameters": {"config": smaller}}
        assert (await http.post("/v2/repository/models/sim/load", json=body)).status_code == 200
        reloaded = await table.get("sim")
        assert reloaded is not None and await serves(reloaded.generation)
        assert (await http.get("/v2/models/sim/config")).json()["max_batch_size"] == 8

        assert (await http.post("/v2/repository/models/sim/load", json=body)).status_code == 200
        again = await table.get("sim")
        assert again is not None and again.generation == reloaded.generation
