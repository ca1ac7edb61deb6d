"""Bounded state: Redis holds no more than MAXLEN/TTL allow; worker memory does not grow."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_result
from plaza.contract import InferRequest, InferResult
from plaza.errors import DeadlineExceeded
from plaza.gateway.service import GatewayService
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, running_worker, wait_for

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
        unbounded = [k for k, ttl in ttls.items() if ttl == -1]
        assert unbounded == [], f"keys without a TTL: {unbounded[:5]}"
        assert all(ttl <= 120 for k, ttl in ttls.items() if k != stream.encode())
        assert 0 < ttls[stream.encode()] <= s.redis.reply_stream_ttl_s


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
        assert worker.metrics.records["written"] == 6000
        # 5000 more requests of 256 bytes each would be >1.2 MB if anything were kept per
        # request, plus Python objects around it; allow noise, not growth per request.
        assert grown < 24 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB"
        assert worker.offsets.outstanding() == 0 and len(worker.batcher) == 0


MIB_ROW = np.zeros((1, 2**18), np.float32)
"""One request of 1 MiB of tensor data."""
Infer = Callable[[InferRequest, float], Awaitable[InferResult]]


async def queue_and_abandon(infer: Infer, n: int) -> list[str]:
    """Send ``n`` 1 MiB requests (every other one with a short deadline) while no worker
    runs; each sync wait gives up, so the requests stay queued behind a caller that leaves."""
    reqs = [
        make_request("identity", {"INPUT0": MIB_ROW}, timeout_s=0.5 if i % 2 else None)
        for i in range(n)
    ]
    answers = await asyncio.gather(*(infer(r, 3.0) for r in reqs), return_exceptions=True)
    assert all(isinstance(a, DeadlineExceeded) for a in answers), answers  # published, queued
    return [r.id for r in reqs]


async def all_answered(r: redis.asyncio.Redis, s: PlazaSettings, ids: list[str]) -> bool:
    return bool(await r.exists(*(s.names.result_key(i) for i in ids)) == len(ids))


async def test_callers_that_stop_mid_load_leave_only_bounded_state(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    """A gateway and an SDK client stop with 1 MiB requests queued; the late results
    recreate their reply streams, and every key under the prefix still expires or is capped."""
    redis_settings = settings.redis.model_copy(
        update={"stream_maxlen": 50, "result_ttl_s": 120, "reply_stream_ttl_s": 60}
    )
    s = settings.model_copy(update={"redis": redis_settings})
    spec = ModelRepository(REPOSITORY).spec("identity")
    gateway, sdk = GatewayService(s), PlazaClient(s, name="leaver")
    await gateway.start()
    await sdk.start()
    try:
        abandoned = await queue_and_abandon(gateway.infer, 4)
        abandoned += await queue_and_abandon(lambda r, t: sdk.producer.infer(r, spec, t), 4)
    finally:
        await gateway.stop()
        await sdk.stop()
    old_streams = [s.names.reply_stream(gateway.gateway_id), s.names.reply_stream("leaver")]
    async with running_worker(s, "identity"):
        next_gateway, next_sdk = GatewayService(s), PlazaClient(s)
        await next_gateway.start()
        try:
            async with next_sdk:
                fresh = make_request("identity", {"INPUT0": MIB_ROW})
                served = await next_gateway.infer(fresh, 60.0)
                again = await next_sdk.infer("identity", {"INPUT0": MIB_ROW}, timeout_s=60)
                await wait_for(lambda: all_answered(redis_client, s, abandoned), 60, "answers")
        finally:
            await next_gateway.stop()
    assert [r.output("OUTPUT0").to_numpy().nbytes for r in (served, again)] == [2**20] * 2
    late = [decode_result(await redis_client.get(s.names.result_key(i))) for i in abandoned]
    assert [r.error.code if r.error else "ok" for r in late] == ["ok", "timeout"] * 4
    for stream in old_streams:  # recreated by the late results, yet expiring
        assert await redis_client.xlen(stream) >= 1
        assert 0 < await redis_client.ttl(stream) <= 60
    keys = [k async for k in redis_client.scan_iter(match=f"{s.redis.key_prefix}*")]
    assert len(keys) >= len(abandoned) + len(old_streams)
    for key in keys:  # every key expires; streams are capped besides
        assert await redis_client.ttl(key) != -1, f"{key!r} has no TTL"
        if await redis_client.type(key) == b"stream":
            assert await redis_client.xlen(key) <= 50 + STREAM_NODE_ENTRIES, key
