"""Redis failing under the SDK: frozen (SIGSTOP), its consumer group lost, out of memory.

Real Kafka and a private redis-server per test (frozen, or its config changed), so that the
shared one is never touched. A frozen server is always resumed before the test ends. The
bounds here are generous guards (many times the wanted time, well under what the faults
cost without the fixes), never measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio

from plaza import producer as producer_module
from plaza.client import PlazaClient
from plaza.contract import InferResult
from plaza.errors import DeadlineExceeded, Unavailable
from plaza.results import consume_stream
from plaza.stack import RedisServer
from plaza.tensors import Tensor
from plaza.workers.writer import ResultWriter
from tests.support import make_settings, running_worker, wait_for

X = {"INPUT0": np.zeros((1, 4), np.float32)}


async def exists(client: redis.asyncio.Redis, key: str) -> bool:
    return bool(await client.exists(key))


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """``server`` stopped (SIGSTOP: connections stay open, nothing answers), then resumed."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_a_poll_and_a_result_end_in_their_time_when_redis_is_frozen(
    kafka_bootstrap: str,
    unique_id: str,
    make_repository: Callable[..., Any],
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    settings = make_settings(
        kafka_bootstrap, server.url, unique_id, repository=make_repository("identity")
    )
    async with PlazaClient(settings) as client:
        assert (await client.poll("no-such-job")).state == "unknown"
        with frozen(server):
            # without a bound: redis-py's 5 s read timeout, three retries (21 s, 52 s)
            async with asyncio.timeout(8):
                with pytest.raises(Unavailable, match="Redis did not answer in 1 s"):
                    await client.result("no-such-job", timeout_s=1)
                with pytest.raises(Unavailable, match="Redis did not answer in 2 s"):
                    await client.poll("no-such-job")


async def test_a_timed_out_call_does_not_wait_for_its_job_marker(
    kafka_bootstrap: str,
    unique_id: str,
    make_repository: Callable[..., Any],
    redis_server_factory: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a marker write that may wait long: the caller must not wait for it at all
    monkeypatch.setattr(producer_module, "MARK_TIMEOUT_S", 60.0)
    server = redis_server_factory()
    settings = make_settings(
        kafka_bootstrap, server.url, unique_id, repository=make_repository("identity")
    )
    async with PlazaClient(settings) as client:  # no worker: no answer comes
        with pytest.raises(DeadlineExceeded):
            await client.infer("identity", X, timeout_s=0.5)  # its reply stream is read
        with frozen(server):
            async with asyncio.timeout(20):  # 60 s with the marker written in the call
                with pytest.raises(DeadlineExceeded) as late:
                    await client.infer("identity", X, timeout_s=1)
        job_id = late.value.details["job_id"]
        admin = redis.asyncio.Redis.from_url(server.url)
        try:  # the marker is written once Redis answers again
            key = settings.names.job_key(job_id)
            await wait_for(lambda: exists(admin, key), 30, "the job marker")
            assert (await client.poll(job_id)).state == "pending"
        finally:
            await admin.aclose()


async def test_result_waits_for_a_submitted_job_whose_marker_redis_refused(
    kafka_bootstrap: str,
    unique_id: str,
    make_repository: Callable[..., Any],
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    settings = make_settings(
        kafka_bootstrap, server.url, unique_id, repository=make_repository("identity")
    )
    admin = redis.asyncio.Redis.from_url(server.url)
    try:
        async with running_worker(settings, "identity"), PlazaClient(settings) as client:
            await client.infer("identity", X, timeout_s=60)  # warm
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", 1)  # every write is refused (OOM)
            job_id = await client.submit("identity", X)  # its marker is refused
            assert (await client.poll(job_id)).state == "unknown"
            await admin.config_set("maxmemory", 0)
            done = await client.result(job_id, timeout_s=60)  # not JobNotFound
            assert done.outputs[0].to_numpy().tolist() == [[0.0, 0.0, 0.0, 0.0]]
    finally:
        await admin.aclose()


async def test_a_consumer_reads_on_after_its_group_is_lost(
    unique_id: str, redis_server_factory: Callable[..., RedisServer]
) -> None:
    server = redis_server_factory()
    settings = make_settings("127.0.0.1:1", server.url, unique_id)
    stream = settings.names.results_stream("pipe")
    client = redis.asyncio.Redis.from_url(server.url)
    writer = ResultWriter(client, settings.redis, settings.names)

    async def answer(rid: str) -> None:
        result = InferResult(
            rid, "identity", "1", outputs=(Tensor.from_numpy("OUTPUT0", np.zeros(1, np.float32)),)
        )
        await writer.write([(result, stream)])

    entries = consume_stream(client, stream, "g", "c", block_ms=100)
    try:
        await answer("before")
        _, first = await anext(entries)
        assert [r.id for r in first] == ["before"]
        await client.delete(stream)  # as an eviction, an expiry or an empty restart does
        after = asyncio.ensure_future(anext(entries))  # reads (NOGROUP) before the write
        await wait_for(lambda: exists(client, stream), 30, "the group made again")
        await answer("after")
        _, second = await asyncio.wait_for(after, 30)
        assert [r.id for r in second] == ["after"]
    finally:
        await entries.aclose()  # type: ignore[attr-defined]
        await writer.close()
        await client.aclose()
