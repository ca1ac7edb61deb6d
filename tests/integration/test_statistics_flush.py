"""The statistics flush on the real Redis: each change is added once, however its calls end.

A flush's pipeline is the seam: these wrap a real pipeline to end a call the ways a
heartbeat's can: its reply held until the heartbeat is cancelled (``Worker.stop``) after
Redis ran it, a connection that drops before anything is sent, and a client's retry that
sends the same call twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from plaza.naming import Names
from plaza.settings import WorkerSettings
from plaza.statistics import MAX_UNCONFIRMED_FLUSHES, ModelStatistics
from plaza.workers.metrics import WorkerMetrics

MODEL = "identity"


class HeldReply:
    """Redis runs the call; its reply never reaches the caller (it waits until cancelled)."""

    def __init__(self, redis_client: redis.asyncio.Redis) -> None:
        self._pipe = redis_client.pipeline(transaction=False)
        self.ran = asyncio.Event()

    def eval(self, *args: Any) -> None:
        self._pipe.eval(*args)

    async def execute(self) -> list[Any]:
        await self._pipe.execute()
        self.ran.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Dropped:
    """The connection drops before the call is sent: Redis never runs it."""

    def eval(self, *args: Any) -> None:
        pass

    async def execute(self) -> list[Any]:
        raise RedisConnectionError("Connection closed by server.")


class SentTwice:
    """A client's retry: the same call reaches Redis twice (the first reply was lost)."""

    def __init__(self, redis_client: redis.asyncio.Redis) -> None:
        self._redis = redis_client
        self._calls: list[tuple[Any, ...]] = []

    def eval(self, *args: Any) -> None:
        self._calls.append(args)

    async def execute(self) -> list[Any]:
        replies: list[Any] = []
        for _ in range(2):
            pipe = self._redis.pipeline(transaction=False)
            for args in self._calls:
                pipe.eval(*args)
            replies = await pipe.execute()
        return replies


def worker_metrics(names: Names) -> WorkerMetrics:
    m = WorkerMetrics(MODEL, names, WorkerSettings(metrics_port=-1), stats_ttl_s=60)
    m.start([1], pending=lambda: 0)
    return m


def answer(m: WorkerMetrics, n: int = 1) -> None:
    """``n`` more requests answered, 1 µs each."""
    for _ in range(n):
        m.version("1").success.add(1000)


async def stored(redis_client: redis.asyncio.Redis, names: Names) -> ModelStatistics:
    return ModelStatistics.from_fields(
        await redis_client.hgetall(names.model_stats_key(MODEL, "1"))
    )


async def test_a_heartbeat_cancelled_after_redis_ran_its_flush_counts_once(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    m = worker_metrics(names)
    answer(m)
    held = HeldReply(redis_client)
    beat = asyncio.create_task(m.flush_with(held))
    await held.ran.wait()  # Redis added the request; the heartbeat has no reply yet
    beat.cancel()  # Worker.stop cancels the heartbeat ...
    with pytest.raises(asyncio.CancelledError):
        await beat
    assert (await stored(redis_client, names)).success.count == 1
    answer(m, 2)
    await m.close(redis_client)  # ... then flushes the last statistics
    got = await stored(redis_client, names)
    assert (got.success.count, got.success.ns) == (3, 3000)


async def test_a_flush_that_never_ran_is_carried_by_the_next(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    m = worker_metrics(names)
    answer(m)
    with pytest.raises(RedisConnectionError):
        await m.flush_with(Dropped())
    answer(m)
    await m.flush_with(redis_client.pipeline(transaction=False))
    assert (await stored(redis_client, names)).success.count == 2
    await m.flush_with(redis_client.pipeline(transaction=False))  # nothing new
    assert (await stored(redis_client, names)).success.count == 2


async def test_a_flush_sent_twice_counts_once(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    m = worker_metrics(names)
    answer(m)
    await m.flush_with(SentTwice(redis_client))
    assert (await stored(redis_client, names)).success.count == 1
    answer(m)
    await m.flush_with(SentTwice(redis_client))
    assert (await stored(redis_client, names)).success.count == 2


async def test_a_long_run_of_lost_replies_loses_and_repeats_nothing(
    names: Names, redis_client: redis.asyncio.Redis
) -> None:
    """More unanswered flushes than are kept: ran or not, each change lands once."""
    m = worker_metrics(names)
    total = 0
    for i in range(MAX_UNCONFIRMED_FLUSHES + 3):
        answer(m)
        total += 1
        if i % 2:
            with pytest.raises(RedisConnectionError):
                await m.flush_with(Dropped())
            continue
        held = HeldReply(redis_client)
        beat = asyncio.create_task(m.flush_with(held))
        await held.ran.wait()
        beat.cancel()
        with pytest.raises(asyncio.CancelledError):
            await beat
    await m.close(redis_client)
    assert (await stored(redis_client, names)).success.count == total


async def test_two_workers_flushes_add_up(names: Names, redis_client: redis.asyncio.Redis) -> None:
    """Each worker's flushes are its own: one's applied flushes do not hide the other's."""
    first, second = worker_metrics(names), worker_metrics(names)
    answer(first)
    answer(second, 2)
    await first.flush_with(redis_client.pipeline(transaction=False))
    await second.flush_with(redis_client.pipeline(transaction=False))
    await first.close(redis_client)
    await second.close(redis_client)
    assert (await stored(redis_client, names)).success.count == 3
