"""The SDK's calls and its stop, against real Kafka and Redis: ``stop`` ends a ``result``
that polls, and every call after it; ``infer``'s ``timeout_s`` is the request's deadline;
a correlation id in flight on the client is refused for a second call; a dropped
``SyncPlazaClient`` ends its loop thread."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import numpy as np
import pytest

from plaza.client import PlazaClient, SyncPlazaClient
from plaza.errors import DeadlineExceeded, InvalidInput, Unavailable
from plaza.settings import PlazaSettings
from tests.support import running_worker

X = {"INPUT0": np.full((1, 3), 2.0, np.float32)}
BOUND_S = 30.0
"""How long a call that must end at once is given (a bound, not a timing assertion)."""


def signal_first_call(client: PlazaClient, method: str) -> asyncio.Event:
    """An event set when the client's producer is first asked ``method``."""
    called = asyncio.Event()
    original = getattr(client.producer, method)

    async def noted(*args: Any, **kwargs: Any) -> Any:
        called.set()
        return await original(*args, **kwargs)

    setattr(client.producer, method, noted)
    return called


async def test_stop_ends_a_running_result_and_refuses_later_calls(
    settings: PlazaSettings,
) -> None:
    client = PlazaClient(settings)
    await client.start()
    job = await client.submit("identity", X)  # no worker: it stays pending
    polled = signal_first_call(client, "poll")
    waiting = asyncio.create_task(client.result(job, timeout_s=300))
    await asyncio.wait_for(polled.wait(), BOUND_S)
    await client.stop()
    done, _ = await asyncio.wait({waiting}, timeout=BOUND_S)
    if not done:
        waiting.cancel()
    assert done, "result() still polls after stop()"
    with pytest.raises(Unavailable):
        await waiting
    with pytest.raises(Unavailable):
        await client.poll(job)
    with pytest.raises(Unavailable):
        await client.result(job, timeout_s=1)
    with pytest.raises(Unavailable):
        await client.submit("identity", X)
    with pytest.raises(Unavailable):
        await client.infer("identity", X, timeout_s=1)
    assert not client._redis.connection_pool._in_use_connections  # nothing reopened


async def test_infer_timeout_is_the_requests_deadline(settings: PlazaSettings) -> None:
    async with PlazaClient(settings) as client:
        with pytest.raises(DeadlineExceeded) as caught:
            await client.infer("identity", X, timeout_s=0.5)  # no worker yet
        job = caught.value.details["job_id"]
        async with running_worker(settings, "identity"):
            late = await client.result(job, timeout_s=BOUND_S, raise_on_error=False)
    assert late.error is not None, "a request its caller gave up on was still computed"
    assert late.error.code == "timeout"


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), -5.0, 0.0, True])
async def test_infer_refuses_a_bad_timeout_before_publishing(
    settings: PlazaSettings, timeout_s: float
) -> None:
    async with PlazaClient(settings) as client:
        published = signal_first_call(client, "infer")
        with pytest.raises(InvalidInput):
            await asyncio.wait_for(client.infer("identity", X, timeout_s=timeout_s), BOUND_S)
        with pytest.raises(InvalidInput):
            stream = client.infer_stream("identity", X, timeout_s=timeout_s)
            await asyncio.wait_for(anext(stream), BOUND_S)
        assert not published.is_set()


async def test_a_correlation_id_in_flight_is_refused_at_once(settings: PlazaSettings) -> None:
    async with PlazaClient(settings) as client:
        sent = signal_first_call(client, "infer")
        first = asyncio.create_task(
            client.infer("identity", X, correlation_id="dup-1", timeout_s=15)  # no worker
        )
        await asyncio.wait_for(sent.wait(), BOUND_S)
        with pytest.raises(InvalidInput) as caught:
            await client.infer("identity", X, correlation_id="dup-1", timeout_s=BOUND_S)
        assert caught.value.details["correlation_id"] == "dup-1"
        with pytest.raises(InvalidInput):
            async for _ in client.infer_stream(
                "identity", X, correlation_id="dup-1", timeout_s=BOUND_S
            ):
                pass
        with pytest.raises(DeadlineExceeded):
            await first  # its own wait was not disturbed


def test_a_dropped_sync_client_ends_its_loop_thread(settings: PlazaSettings) -> None:
    client = SyncPlazaClient(settings)
    thread: threading.Thread = client._thread
    del client
    gc.collect()
    thread.join(timeout=BOUND_S)
    assert not thread.is_alive()
