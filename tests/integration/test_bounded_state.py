"""Bounded state: Redis holds no more than MAXLEN/TTL allow; worker memory does not grow."""

from __future__ import annotations

import numpy as np

from plaza.client import PlazaClient, make_request
from plaza.settings import PlazaSettings
from tests.support import running_worker

STREAM_NODE_ENTRIES = 100
"""Redis trims ``MAXLEN ~`` in whole stream nodes (stream-node-max-entries, 100 by default)."""


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def serve(client: PlazaClient, stream: str, n: int, start: int) -> None:
    ids = await client.publish_many(
        make_request("identity", {"INPUT0": np.full((1, 64), i, np.float32)}, reply_stream=stream)
        for i in range(start, start + n)
    )
    want, got = set(ids), 0
    async for entry, results in client.consume(stream, "g", "c", block_ms=500):
        got += sum(1 for r in results if r.id in want)
        await client.ack(stream, "g", entry)
        if got == n:
            return


async def test_redis_state_is_bounded_by_maxlen_and_ttl(settings: PlazaSettings) -> None:
    redis = settings.redis.model_copy(
        update={"stream_maxlen": 20, "result_ttl_s": 120, "stats_ttl_s": 120}
    )
    s = settings.model_copy(update={"redis": redis})
    async with running_worker(s, "identity", max_pending=8), PlazaClient(s) as client:
        stream = client.results_stream("bounded")
        await serve(client, stream, 1500, 0)
        assert await client._redis.xlen(stream) <= 20 + STREAM_NODE_ENTRIES
        keys = [k async for k in client._redis.scan_iter(match=f"{s.redis.key_prefix}*")]
        assert len(keys) >= 1500
        ttls = {k: await client._redis.ttl(k) for k in keys}
        unbounded = [k for k, ttl in ttls.items() if ttl == -1 and k != stream.encode()]
        assert unbounded == [], f"keys without a TTL: {unbounded[:5]}"
        assert all(ttl <= 120 for k, ttl in ttls.items() if k != stream.encode())


async def test_worker_memory_does_not_grow_with_requests_served(settings: PlazaSettings) -> None:
    async with (
        running_worker(settings, "identity", max_pending=64) as worker,
        PlazaClient(settings) as client,
    ):
        stream = client.results_stream("rss")
        await serve(client, stream, 1000, 0)  # warm up: allocator pools, caches
        before = rss_bytes()
        for round_ in range(5):
            await serve(client, stream, 1000, 1000 * (round_ + 1))
        grown = rss_bytes() - before
        assert worker.stats.inferences == 6000
        # 5000 more requests of 256 bytes each would be >1.2 MB if anything were kept per
        # request, plus Python objects around it; allow noise, not growth per request.
        assert grown < 24 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB"
        assert worker.offsets.outstanding() == 0 and len(worker.batcher) == 0
