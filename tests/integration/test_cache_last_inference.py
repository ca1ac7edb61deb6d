"""A response-cache hit answers a request of its version, so it moves ``last_inference``
in the statistics API (real Kafka and Redis): a worker answers the first call, then the
worker is gone and the gateway answers the same call from the cache alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio

from plaza.gateway.app import create_app
from plaza.gateway.service import GatewayService
from plaza.settings import PlazaSettings
from tests.integration.test_response_cache import CACHED, body, repository
from tests.support import running_worker, wait_for


@pytest.mark.timeout(180)
async def test_a_cache_hit_moves_last_inference(
    settings: PlazaSettings, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> None:
    s = settings.model_copy(update={"repository": repository(tmp_path / "repo")})
    service = GatewayService(s)
    await service.start()
    try:
        transport = httpx.ASGITransport(app=create_app(s, service))
        async with httpx.AsyncClient(transport=transport, base_url="http://plaza") as http:

            async def stats() -> dict[str, Any]:
                doc = (await http.get(f"/v2/models/{CACHED}/stats")).json()
                found: dict[str, Any] = doc["model_stats"][0]
                return found

            async def successes(n: int) -> bool:
                return bool((await stats())["inference_stats"]["success"]["count"] == n)

            path = f"/v2/models/{CACHED}/infer"
            async with running_worker(s, CACHED):
                first = await http.post(path, json=body("first", 1.5, 2.5))
                assert first.status_code == 200, first.text
            await wait_for(lambda: successes(1), 30, "the worker's success in the statistics")
            # An old answer's time: only the hit below can move it now (no worker runs).
            await redis_client.hset(s.names.model_stats_key(CACHED, "1"), "last_inference", 1)
            assert (await stats())["last_inference"] == 1

            hit_ms = int(time.time() * 1000)
            again = await http.post(path, json=body("again", 1.5, 2.5))
            assert again.status_code == 200, again.text
            await wait_for(lambda: successes(2), 30, "the hit in the statistics")
            found = await stats()
            assert found["inference_stats"]["cache_hit"]["count"] == 1
            assert found["last_inference"] >= hit_ms
    finally:
        await service.stop()
