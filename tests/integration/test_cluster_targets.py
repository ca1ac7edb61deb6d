"""Stream reads on a Redis Cluster go straight to the stream's node.

redis-py's cluster client finds the keys of XREAD and XREADGROUP (they follow a STREAMS
keyword) by asking its default node ``COMMAND GETKEYS`` before every call, so a default node
that stops answering stops every reply read. These tests count the GETKEYS calls each node
served (``INFO commandstats``) around Plaza's reads: none may be asked. The readers of
several keys at once (worker generations, ensemble result lookups) must read keys of many
hash slots.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from plaza.codec import encode_result
from plaza.connections import is_cluster, redis_client
from plaza.contract import InferResult
from plaza.model_control import live_generations, serves_generation
from plaza.replies import ReplyMux
from plaza.results import consume_stream
from plaza.settings import PlazaSettings
from plaza.stack import RedisClusterNodes
from plaza.workers.result_lookup import ResultLookup


@pytest.fixture
async def cluster_client(cluster_settings: PlazaSettings) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis_client(cluster_settings.redis)
    assert is_cluster(client)
    await client.ping()
    try:
        yield client
    finally:
        await client.aclose()


async def getkeys_calls(cluster: RedisClusterNodes) -> int:
    """How many ``COMMAND GETKEYS`` calls the cluster's nodes have served, all together."""
    total = 0
    for port in cluster.ports:
        node = redis.asyncio.Redis(host="127.0.0.1", port=port)
        try:
            stats = await node.info("commandstats")
        finally:
            await node.aclose()
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


def stream_off_default(client: redis.asyncio.Redis, prefix: str) -> str:
    """A stream key whose slot another node than the client's default node serves."""
    default = client.get_default_node()  # type: ignore[attr-defined]
    return next(
        key
        for key in (f"{prefix}{{{i}}}" for i in itertools.count())
        if client.get_node_from_key(key) != default  # type: ignore[attr-defined]
    )


async def test_reply_reads_ask_no_node_for_their_keys(
    cluster_client: redis.asyncio.Redis, redis_cluster: RedisClusterNodes, unique_id: str
) -> None:
    stream = stream_off_default(cluster_client, f"{unique_id}:replies:")
    await cluster_client.xadd(stream, {b"x": b"1"})
    mux = ReplyMux(cluster_client, stream, ttl_s=60, maxlen=100)
    before = await getkeys_calls(redis_cluster)
    entries = await mux._read()
    assert [fields for _, fields, _ in entries] == [None]  # the entry came, from its node
    assert await getkeys_calls(redis_cluster) == before


async def test_result_stream_reads_ask_no_node_for_their_keys(
    cluster_client: redis.asyncio.Redis, redis_cluster: RedisClusterNodes, unique_id: str
) -> None:
    stream = stream_off_default(cluster_client, f"{unique_id}:results:")
    before = await getkeys_calls(redis_cluster)
    got = [
        entry
        async for entry in consume_stream(
            cluster_client, stream, "g", "c", block_ms=50, idle_exit=True
        )
    ]
    assert got == []
    assert await getkeys_calls(redis_cluster) == before


async def test_worker_generations_are_read_across_slots(
    cluster_client: redis.asyncio.Redis, cluster_settings: PlazaSettings
) -> None:
    names = cluster_settings.names
    workers = ["w-1", "w-2", "w-3"]
    assert len({cluster_client.keyslot(names.worker_info_key(w)) for w in workers}) > 1  # type: ignore[attr-defined]
    for i, worker in enumerate(workers):
        await cluster_client.zadd(names.worker_registry_key("m"), {worker: time.time() + 60})
        await cluster_client.set(names.worker_info_key(worker), json.dumps({"generation": i}))
    assert await live_generations(cluster_client, names, "m") == {0, 1, 2}
    assert await serves_generation(cluster_client, names, ["m"], 2)


async def test_result_lookups_read_keys_across_slots(
    cluster_client: redis.asyncio.Redis, cluster_settings: PlazaSettings
) -> None:
    names = cluster_settings.names
    ids = [f"req-{i}" for i in range(6)]
    assert len({cluster_client.keyslot(names.result_key(i)) for i in ids}) > 1  # type: ignore[attr-defined]
    for rid in ids[:4]:
        await cluster_client.set(names.result_key(rid), encode_result(InferResult(rid, "m", "1")))
    lookup = ResultLookup(cluster_client, names)
    lookup.start()
    try:
        found = await asyncio.gather(*(lookup.get(rid) for rid in ids))
    finally:
        await lookup.stop()
    assert [r.id if r else None for r in found] == [*ids[:4], None, None]
