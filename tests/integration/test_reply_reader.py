"""A client's reply reader and job polling against entries it did not expect, on real
Kafka and Redis.

- A caller still waiting for its answer when its client stops was not cancelled: it gets
  Unavailable (and no ``cancelled`` answer is stored for its request, which a worker would
  then skip), never a CancelledError that reads as its own cancellation.
- A reply entry whose count field is past what a msgpack array can announce is read map by
  map: its answer reaches its caller, and the reader goes on (it used to die on it, and
  every later call timed out).
- A stored result that does not decode is an internal error when polled (HTTP 500), not a
  retriable Unavailable that a client polls again until the key expires.

No worker runs: the tests write what a worker would, or nothing.
"""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.codec import encode_results
from plaza.contract import InferResult
from plaza.errors import PlazaError, Unavailable
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.settings import PlazaSettings
from tests.support import wait_for

MODEL = "identity"


async def test_a_caller_waiting_when_its_client_stops_gets_unavailable(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    client = PlazaClient(settings)
    await client.start()
    req = make_request(MODEL, {"INPUT0": np.zeros((1, 3), np.float32)})
    try:
        mux = await client.producer.replies()
        call = asyncio.create_task(client.producer.infer(req, None, 60))
        await wait_for(lambda: mux.waiting == 1, what="the call to wait for its answer")
    finally:
        await client.stop()
    with pytest.raises(Unavailable, match="reader stopped"):
        await call
    assert not call.cancelled()
    assert await redis_client.get(settings.names.result_key(req.id)) is None


async def test_a_reply_entry_with_an_oversized_count_is_read_and_the_reader_goes_on(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    async with PlazaClient(settings) as client:
        mux = await client.producer.replies()
        first, second = (make_request(MODEL, {"INPUT0": np.ones((1, 2), np.float32)}) for _ in "ab")
        calls = [asyncio.create_task(client.producer.infer(r, None, 60)) for r in (first, second)]
        await wait_for(lambda: mux.waiting == 2, what="both calls to wait")
        for req, count in ((first, b"4294967296"), (second, b"1")):
            answer = InferResult(req.id, MODEL, "1")
            fields = {STREAM_FIELD_COUNT: count, STREAM_FIELD_RESULTS: encode_results([answer])}
            await redis_client.xadd(mux.stream, fields)  # type: ignore[arg-type]
        async with asyncio.timeout(30):
            answers = await asyncio.gather(*calls)
    assert [a.id for a in answers] == [first.id, second.id]


@pytest.mark.parametrize(
    "stored",
    [b"\xc1", msgpack.packb({"id": "x", "model": MODEL, "timing_us": [1]})],
    ids=["not msgpack", "a field of the wrong type"],
)
async def test_a_stored_result_that_does_not_decode_is_an_internal_error(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis, stored: bytes
) -> None:
    job_id = "corrupt-job"
    await redis_client.set(settings.names.result_key(job_id), stored, ex=60)
    async with PlazaClient(settings) as client:
        with pytest.raises(PlazaError, match="does not decode") as info:
            await client.poll(job_id)
    assert info.value.code == "internal" and not info.value.retriable
    assert info.value.details == {"job_id": job_id}
