"""A worker's delivery counters after it stops (real Kafka and Redis).

Intake counts each record's deliveries in Redis (``workers/deliveries.py``); a record's
counter goes once it is answered, in the next count or heartbeat. A worker that stops
releases the counters it still holds: the answered records' and, for the records it hands
to the next owner, a first delivery's. Those it left used to stay until their ttl, and a
record handed over then came back to its next owner as a suspect, run alone.
"""

from __future__ import annotations

import numpy as np
import redis.asyncio

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from tests.support import running_worker

MODEL = "identity"


async def delivery_counters(client: redis.asyncio.Redis, settings: PlazaSettings) -> list[bytes]:
    pattern = settings.names.delivery_key("*", 0, 0).rsplit(":", 3)[0] + ":*"
    return [key async for key in client.scan_iter(match=pattern, count=1000)]


async def test_a_stopped_worker_leaves_no_delivery_counters(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    # no heartbeat in the test's time: what is released is the stop's doing
    async with (
        PlazaClient(settings) as client,
        running_worker(settings, MODEL, heartbeat_interval_s=3600),
    ):
        x = {"INPUT0": np.ones((1, 2), np.float32)}
        answers = [await client.infer(MODEL, x, timeout_s=60) for _ in range(3)]
        assert await delivery_counters(redis_client, settings)  # the last one's, held
    assert all(a.error is None for a in answers)
    assert await delivery_counters(redis_client, settings) == []
