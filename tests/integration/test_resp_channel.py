"""plaza.resp_channel on a real Redis: pipelined replies in order, errors, scripts, the
connection's settings taken from redis-py's client, and a lost connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from plaza.connections import redis_client
from plaza.event_loop import run
from plaza.resp_channel import CommandError, RespChannel, channel_for
from plaza.settings import RedisSettings
from plaza.stack import RedisServer, wait_for


def channel(client: redis.asyncio.Redis) -> RespChannel:
    ch = channel_for(client)
    assert ch is not None
    return ch


async def test_replies_come_back_in_order_with_many_in_flight(
    redis_client: redis.asyncio.Redis, key_prefix: str
) -> None:
    ch = channel(redis_client)
    try:
        key = f"{key_prefix}counter"
        replies = await asyncio.gather(*(ch.call("INCR", key) for _ in range(200)))
        assert replies == list(range(1, 201))
        assert await ch.call("SET", f"{key_prefix}k", b"\x00\xffbytes") == b"OK"
        assert await redis_client.get(f"{key_prefix}k") == b"\x00\xffbytes"
        assert await ch.call("GET", f"{key_prefix}missing") is None
    finally:
        await ch.close()


async def test_an_error_reply_raises_and_the_channel_goes_on(
    redis_client: redis.asyncio.Redis, key_prefix: str
) -> None:
    ch = channel(redis_client)
    try:
        await ch.call("SET", f"{key_prefix}s", "text")
        with pytest.raises(CommandError, match="WRONGTYPE") as info:
            await ch.call("LPUSH", f"{key_prefix}s", "x")
        assert isinstance(info.value, ResponseError)  # what redis-py raises, for callers
        assert await ch.call("PING") == b"PONG"
    finally:
        await ch.close()


async def test_a_script_is_sent_whole_when_redis_lost_it(
    redis_client: redis.asyncio.Redis, key_prefix: str
) -> None:
    script = redis_client.register_script("return {KEYS[1], ARGV[1] + 1}")
    ch = channel(redis_client)
    try:
        await redis_client.script_flush()
        assert await redis_client.script_exists(script.sha) == [False]
        assert await ch.evalsha(script, [f"{key_prefix}a"], [41]) == [
            f"{key_prefix}a".encode(),
            42,
        ]
        assert await redis_client.script_exists(script.sha) == [True]  # EVAL cached it
        assert await ch.evalsha(script, [f"{key_prefix}b"], [1]) == [f"{key_prefix}b".encode(), 2]
        with pytest.raises(CommandError, match="ERR"):
            bad = redis_client.register_script("return redis.call('NOSUCHCOMMAND')")
            await ch.evalsha(bad, [], [])
    finally:
        await ch.close()


async def test_password_and_db_come_from_the_client(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(password="s3cret")
    base = server.url.rsplit("/", 1)[0]
    client = redis_client(RedisSettings(url=f"{base}/3"))
    ch = channel(client)
    try:
        await ch.call("SET", "on-db-3", "yes")
        assert await client.get("on-db-3") == b"yes"
        db0 = redis.asyncio.Redis.from_url(f"{base}/0")
        assert await db0.get("on-db-3") is None
        await db0.aclose()
    finally:
        await ch.close()
        await client.aclose()
    wrong = redis_client(RedisSettings(url=f"redis://127.0.0.1:{server.port}/0", password="nope"))
    ch = channel(wrong)
    with pytest.raises(ResponseError):  # refused credentials
        await ch.call("PING")
    assert not ch.connected  # and no half-made connection is kept


async def test_a_lost_connection_fails_the_calls_in_flight_then_reconnects(
    redis_client: redis.asyncio.Redis, key_prefix: str
) -> None:
    ch = channel(redis_client)
    try:
        client_id = await ch.call("CLIENT", "ID")
        blocked = asyncio.create_task(ch.call("BLPOP", f"{key_prefix}never", 10))

        async def blocked_in_blpop() -> bool:
            listing = await redis_client.execute_command("CLIENT", "LIST", "ID", client_id)
            return b"cmd=blpop" in listing

        await wait_for(blocked_in_blpop, 5, "the channel's BLPOP to block in Redis")
        assert await redis_client.execute_command("CLIENT", "KILL", "ID", client_id) == 1
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(blocked, 5)
        assert await ch.call("PING") == b"PONG"  # a new connection
        assert await ch.call("CLIENT", "ID") != client_id
    finally:
        await ch.close()


async def test_redis_restarting_costs_at_most_the_call_it_cut(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    client = redis_client(RedisSettings(url=server.url))
    ch = channel(client)
    try:
        assert await ch.call("SET", "kept", "1") == b"OK"
        server.stop()
        with pytest.raises(RedisConnectionError):
            await ch.call("PING")  # nothing listens: a clear error, not a hang
        server.start()
        server.wait_ready()
        assert await ch.call("GET", "kept") == b"1"  # AOF kept it; the channel reconnected
    finally:
        await ch.close()
        await client.aclose()


async def test_close_is_idempotent_and_a_call_after_it_connects_again(
    redis_client: redis.asyncio.Redis,
) -> None:
    ch = channel(redis_client)
    assert await ch.call("PING") == b"PONG"
    assert ch.connected
    await ch.close()
    await ch.close()
    assert not ch.connected
    assert await ch.call("PING") == b"PONG"
    await ch.close()


def test_no_channel_for_a_cluster() -> None:
    cluster = redis_client(RedisSettings(url="redis://127.0.0.1:1/0", cluster=True))
    assert channel_for(cluster) is None


async def test_a_tls_url_gets_a_tls_channel_that_fails_clearly_without_a_server() -> None:
    client = redis_client(RedisSettings(url="rediss://127.0.0.1:1/0"))
    ch = channel(client)
    with pytest.raises(RedisConnectionError, match="cannot connect"):
        await ch.call("PING")
    await client.aclose()


def test_on_uvloop_as_the_serving_processes_run(redis_url: str) -> None:
    """uvloop's transports are their own classes (not asyncio.Transport subclasses)."""

    async def main() -> list[object]:
        client = redis_client(RedisSettings(url=redis_url))
        ch = channel(client)
        try:
            return list(await asyncio.gather(*(ch.call("PING") for _ in range(3))))
        finally:
            await ch.close()
            await client.aclose()

    assert run(main(), loop="uvloop") == [b"PONG"] * 3
