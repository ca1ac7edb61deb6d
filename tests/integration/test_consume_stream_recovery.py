"""A pipeline consumer that comes back to pending entries it cannot read (trimmed away, or
undecodable) acknowledges and skips them, and goes on to the live entries behind them."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio

from plaza.contract import InferResult
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.results import ResultStore, consume_stream
from plaza.settings import PlazaSettings
from plaza.workers.writer import ResultWriter

GROUP = "g"
CONSUMER = "c1"


def result(rid: str) -> InferResult:
    return InferResult(rid, "m", "1")


async def write(settings: PlazaSettings, r: redis.asyncio.Redis, stream: str, *ids: str) -> None:
    """One stream entry per id, written as a worker writes them (result key, then XADD)."""
    writer = ResultWriter(r, settings.redis, settings.names)
    for rid in ids:
        assert await writer.write([(result(rid), stream)]) == 1


async def take_without_ack(r: redis.asyncio.Redis, stream: str) -> bytes:
    """Read the stream's next entry as CONSUMER and crash: it stays pending."""
    await r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    reply = await r.xreadgroup(GROUP, CONSUMER, {stream: ">"}, count=1)
    [(_, [(entry_id, _)])] = reply
    return bytes(entry_id)


async def drain(r: redis.asyncio.Redis, stream: str, *, count: int = 64) -> list[str]:
    """A restarted CONSUMER: every result id it is given, each entry acknowledged, until
    the stream is idle (a bound of 50 entries, so a consumer stuck on the same entries
    fails the test instead of hanging it)."""
    got: list[str] = []
    reader = consume_stream(r, stream, GROUP, CONSUMER, count=count, block_ms=100, idle_exit=True)
    async for entry_id, results in reader:
        got.extend(res.id for res in results)
        await r.xack(stream, GROUP, entry_id)
        if len(got) > 50:
            break
    await reader.aclose()
    return got


async def pending(r: redis.asyncio.Redis, stream: str) -> int:
    summary = await r.xpending(stream, GROUP)
    return int(summary["pending"])


async def test_a_pending_entry_trimmed_away_is_acknowledged_and_the_live_ones_follow(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    stream = settings.names.results_stream("trimmed")
    await write(settings, redis_client, stream, "lost")
    trimmed_id = await take_without_ack(redis_client, stream)
    await write(settings, redis_client, stream, "a", "b", "c")
    await redis_client.xtrim(stream, maxlen=3, approximate=False)  # MAXLEN while it was down
    assert trimmed_id not in [e for e, _ in await redis_client.xrange(stream)]
    assert await pending(redis_client, stream) == 1

    with caplog.at_level(logging.WARNING, logger="plaza.results"):
        assert await drain(redis_client, stream) == ["a", "b", "c"]

    assert await pending(redis_client, stream) == 0
    [record] = [rec for rec in caplog.records if trimmed_id.decode() in rec.getMessage()]
    assert record.levelno == logging.WARNING
    assert stream in record.getMessage()
    # what the log says: the trimmed entry's result is still under its result key
    status = await ResultStore(redis_client, settings.redis, settings.names).poll("lost")
    assert status.state == "done"


@pytest.mark.parametrize("when", ["pending", "live"])
async def test_an_undecodable_entry_is_acknowledged_and_skipped(
    when: str,
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = settings.names.results_stream("garbage")
    garbage = {STREAM_FIELD_COUNT: b"1", STREAM_FIELD_RESULTS: b"\xc1 not msgpack"}
    await redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    bad_id = await redis_client.xadd(stream, garbage)
    if when == "pending":
        await redis_client.xreadgroup(GROUP, CONSUMER, {stream: ">"}, count=1)  # and crash
        assert await pending(redis_client, stream) == 1
    await write(settings, redis_client, stream, "a", "b")

    with caplog.at_level(logging.ERROR, logger="plaza.results"):
        assert await drain(redis_client, stream) == ["a", "b"]

    assert await pending(redis_client, stream) == 0
    [record] = [rec for rec in caplog.records if bad_id.decode() in rec.getMessage()]
    assert record.levelno == logging.ERROR
    assert stream in record.getMessage()
    # acknowledged, not deleted: the entry stays in the stream for a look (XRANGE)
    assert await redis_client.xrange(stream, min=bad_id, max=bad_id) != []


async def test_pending_entries_left_unacknowledged_are_each_given_once(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    stream = settings.names.results_stream("unacked")
    await write(settings, redis_client, stream, "p1", "p2", "p3")
    await redis_client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    await redis_client.xreadgroup(GROUP, CONSUMER, {stream: ">"}, count=3)  # and crash
    await write(settings, redis_client, stream, "a")

    got: list[str] = []
    reader = consume_stream(
        redis_client, stream, GROUP, CONSUMER, count=2, block_ms=100, idle_exit=True
    )
    async for _, results in reader:  # acknowledging nothing (a caller that acks later)
        got.extend(res.id for res in results)
        if len(got) > 10:
            break
    await reader.aclose()

    assert got == ["p1", "p2", "p3", "a"]
    assert await pending(redis_client, stream) == 4
