"""The response cache's statistics flush on the real Redis: each hit and miss is added
once, however the calls that carry it end (as a worker's heartbeat flush,
tests/integration/test_statistics_flush.py).

The flush's pipeline is the seam (``ResponseCache.flush_with``): these wrap a real
pipeline to end a call the ways a flush's can: a client's retry that sends the same call
twice (its first reply lost), its reply held until the flush is cancelled (a stopping
producer) after Redis ran it, and a connection that drops before anything is sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from plaza.naming import Names
from plaza.response_cache import ResponseCache
from plaza.settings import ResponseCacheSettings
from plaza.statistics import MAX_UNCONFIRMED_FLUSHES, ModelStatistics

MODEL = "identity"


class SentTwice:
    """A client's retry: the same call reaches Redis twice (the first reply was lost)."""

    def __init__(self, redis_client: redis.asyncio.Redis) -> None:
        self._redis = redis_client
        self.calls: list[tuple[Any, ...]] = []

    def eval(self, *args: Any) -> None:
        self.calls.append(args)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies: list[Any] = []
        for _ in range(2):
            pipe = self._redis.pipeline(transaction=False)
            for args in self.calls:
                pipe.eval(*args)
            replies = await pipe.execute(raise_on_error=raise_on_error)
        return replies


class HeldReply:
    """Redis runs the call; its reply never reaches the caller (it waits until cancelled)."""

    def __init__(self, redis_client: redis.asyncio.Redis) -> None:
        self._pipe = redis_client.pipeline(transaction=False)
        self.ran = asyncio.Event()

    def eval(self, *args: Any) -> None:
        self._pipe.eval(*args)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        await self._pipe.execute(raise_on_error=raise_on_error)
        self.ran.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Dropped:
    """The connection drops before the call is sent: Redis never runs it."""

    def __init__(self) -> None:
        self.calls = 0

    def eval(self, *args: Any) -> None:
        self.calls += 1

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        raise RedisConnectionError("Connection closed by server.")


def response_cache(redis_client: redis.asyncio.Redis, names: Names) -> ResponseCache:
    return ResponseCache(
        redis_client, ResponseCacheSettings(), names, lambda spec: "1", stats_ttl_s=60
    )


def looked_up(cache: ResponseCache, hits: int = 0, misses: int = 0) -> None:
    """``hits`` and ``misses`` more lookups of the model's version 1, 1 µs each."""
    for _ in range(hits):
        cache.statistics.hit(MODEL, "1", 0.000001)
    for _ in range(misses):
        cache.statistics.miss(MODEL, "1", 0.000001)


async def stored(redis_client: redis.asyncio.Redis, names: Names) -> tuple[int, int, int]:
    """The version's (cache_hit, cache_miss, success) counts in its statistics hash."""
    raw = await redis_client.hgetall(names.model_stats_key(MODEL, "1"))
    got = ModelStatistics.from_fields(raw)
    return got.cache_hit.count, got.cache_miss.count, got.success.count


async def test_a_flush_sent_twice_counts_once(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    cache = response_cache(redis_client, names)
    looked_up(cache, hits=1, misses=2)
    await cache.flush_with(SentTwice(redis_client))
    assert await stored(redis_client, names) == (1, 2, 1)
    looked_up(cache, hits=1)
    await cache.flush_with(SentTwice(redis_client))
    assert await stored(redis_client, names) == (2, 2, 2)
    raw = await redis_client.hgetall(names.model_stats_key(MODEL, "1"))
    assert int(raw[b"cache_hit.ns"]) == 2000


async def test_a_flush_that_never_ran_is_carried_by_the_next(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    cache = response_cache(redis_client, names)
    looked_up(cache, hits=1)
    with pytest.raises(RedisConnectionError):
        await cache.flush_with(Dropped())
    looked_up(cache, misses=1)
    await cache.flush()
    assert await stored(redis_client, names) == (1, 1, 1)
    idle = Dropped()
    await cache.flush_with(idle)  # nothing new and nothing unconfirmed: no call at all
    assert idle.calls == 0


async def test_a_flush_cancelled_after_redis_ran_it_counts_once(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    cache = response_cache(redis_client, names)
    looked_up(cache, hits=1)
    held = HeldReply(redis_client)
    flushing = asyncio.create_task(cache.flush_with(held))
    await held.ran.wait()  # Redis added the hit; the flush has no reply yet
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    assert await stored(redis_client, names) == (1, 0, 1)
    looked_up(cache, misses=1)
    await cache.stop()  # the last flush sends the unconfirmed one again: passed over
    assert await stored(redis_client, names) == (1, 1, 1)


async def test_a_long_run_of_failed_flushes_loses_and_repeats_nothing(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    """More unanswered flushes than are kept: ran or not, each lookup lands once."""
    cache = response_cache(redis_client, names)
    for i in range(MAX_UNCONFIRMED_FLUSHES + 3):
        looked_up(cache, hits=1, misses=1)
        if i % 2:
            with pytest.raises(RedisConnectionError):
                await cache.flush_with(Dropped())
            continue
        held = HeldReply(redis_client)
        flushing = asyncio.create_task(cache.flush_with(held))
        await held.ran.wait()
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
    await cache.stop()
    total = MAX_UNCONFIRMED_FLUSHES + 3
    assert await stored(redis_client, names) == (total, total, total)


async def test_two_producers_flushes_add_up(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    """Each cache's flushes are its own: one's applied flushes do not hide the other's."""
    first, second = response_cache(redis_client, names), response_cache(redis_client, names)
    looked_up(first, hits=1)
    looked_up(second, hits=2, misses=1)
    await first.flush()
    await second.flush()
    await first.stop()
    await second.stop()
    assert await stored(redis_client, names) == (3, 1, 3)
