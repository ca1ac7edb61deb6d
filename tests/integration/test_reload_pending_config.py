"""A reload whose new worker is not up yet, as the gateway serves it, on real Kafka and Redis.

A model host (or ``plaza up --process-per-model``) starts a reload's new generation beside
the old one, which serves until the new one does. Triton serves the old model (its config
and validation) until the new one is loaded; so does the gateway: the config of the newest
generation that a live worker names, then the new one's once a worker of it is live. The
workers here are their registry entries, written as a worker heartbeats (real Redis): the
reload reshapes ``sim`` from 16 values a row to 8, so a request shows which config is served.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from plaza.gateway.main import Serving, serving
from plaza.gateway.registry import ModelRegistry
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from tests.integration.test_refused_reload_gateway import (
    MODEL,
    dims,
    heartbeat,
    http_body,
    reshaped,
    served_dims,
    settings_config,
)
from tests.support import explicit_sim_settings, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit, ``sim`` (16 values a row) in a repository of its own; a load waits
    long enough for the test to start the new generation's worker. No worker answers a
    valid request here, so a sync infer gives up (504) after 1 s, not the default 30 s."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    update = {"load_timeout_s": 60.0, "metrics_port": -1, "sync_timeout_s": 1.0}
    wide = made.gateway.model_copy(update=update)
    return made.model_copy(update={"gateway": wide})


@asynccontextmanager
async def gateway(settings: PlazaSettings) -> AsyncIterator[tuple[Serving, httpx.AsyncClient]]:
    """A gateway (no host: its workers are written by hand) and an HTTP client of it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        async with (
            serving(settings, http_socket=sock, grpc_port=0) as gw,
            httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
        ):
            yield gw, http
    finally:
        sock.close()


async def served_width(http: httpx.AsyncClient) -> int:
    """The width of ``sim``'s INPUT0 in the config the gateway answers (the old and new
    outputs are checked along)."""
    config = (await http.get(f"/v2/models/{MODEL}/config")).json()
    [width], [out] = dims(config)
    assert out == width, config
    return int(width)


async def refuses(http: httpx.AsyncClient, width: int) -> bool:
    """Whether a request ``width`` values a row is refused as invalid (the other width is
    the one served; a valid one waits in Kafka for a worker that never comes, and is
    answered 504 after the gateway's short ``sync_timeout_s``)."""
    answer = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(width, 1.0))
    return answer.status_code == 400 and answer.json()["code"] == "invalid_input"


async def test_a_reload_serves_the_old_config_until_a_worker_of_the_new_one_is_live(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """The loading gateway (HTTP: config and validation) and one that follows the table
    serve 16 wide while only the old generation's worker is live, and 8 wide once the new
    one's is: the loading gateway when its waiting load returns, the other on a follow."""
    table = ModelTable(redis_client, settings.names)
    following = ModelRegistry(settings)
    following.read_start_models()
    await following.start(redis_client)
    async with gateway(settings) as (gw, http):
        registry = gw.service.registry
        await registry.load(MODEL)  # a first load is served at once (no worker yet)
        assert await served_width(http) == 16
        first = await table.get(MODEL)
        assert first is not None
        await heartbeat(redis_client, settings, "old", first.generation)
        await following.follow()
        assert served_dims(following) == [16]

        config = settings_config(registry)
        load = asyncio.create_task(registry.load(MODEL, reshaped(config, 8), wait=True))

        async def reloaded() -> bool:
            now = await table.get(MODEL)
            return now is not None and now.generation != first.generation

        await wait_for(reloaded, what="the reload written to the model table")
        second = await table.get(MODEL)
        assert second is not None
        await following.follow()
        # Only the old generation's worker is live: its config is served, everywhere.
        assert not load.done()
        assert await served_width(http) == 16
        assert await refuses(http, 8) and not await refuses(http, 16)
        assert served_dims(following) == [16]
        [row] = [r for r in registry.index({MODEL: 1}) if r.name == MODEL]
        assert row.state == "READY" and row.reason == "", row

        await heartbeat(redis_client, settings, "new", second.generation)
        await load  # answers once the new worker serves; its config is served from then on
        assert await served_width(http) == 8
        assert await refuses(http, 16) and not await refuses(http, 8)
        await following.follow()
        assert served_dims(following) == [8]
