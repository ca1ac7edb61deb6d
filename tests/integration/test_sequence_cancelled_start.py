"""A START that never runs leaves no state of the sequence before it usable, however it
failed to run: here, its caller cancelled it before the worker read its record (a
``cancelled`` answer stored first, so intake finds it answered), or the worker refused it
(no room for another sequence).

As Triton's, a START begins a sequence anew. One that never ran must not leave the sum of
the sequence before it (the same id, left without an END) to the request after it, neither
in the worker that holds that sequence nor under the sequence's key in Redis, where a
worker taking the partition over would resume it: that request is refused as not started.
The sample ``accumulate`` keeps a running sum; real Kafka and Redis.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.client import PlazaClient, make_request
from plaza.contract import InferResult
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.workers.sequences import encode_state
from tests.support import REPOSITORY, running_worker

pytestmark = pytest.mark.timeout(120)

MODEL = "accumulate"


def value(x: int) -> dict[str, np.ndarray[Any, Any]]:
    return {"INPUT": np.array([[x]], np.int32)}


async def step(client: PlazaClient, key: int, x: int, *, start: bool = False) -> InferResult:
    params = {"sequence_id": key, "sequence_start": start}
    return await client.infer(MODEL, value(x), parameters=params, raise_on_error=False)


def total(result: InferResult) -> int:
    assert result.error is None, result.error
    return int(result.outputs[0].to_numpy()[0, 0])


async def send_cancelled_start(
    client: PlazaClient, settings: PlazaSettings, redis_client: Any, key: int
) -> None:
    """A START of sequence ``key`` whose caller cancelled it before any worker read it."""
    rid = f"cancelled-start-{key}"
    req = make_request(MODEL, value(100), correlation_id=rid)
    assert await ResultStore(redis_client, settings.redis, settings.names).cancel(req)
    params = {"sequence_id": key, "sequence_start": True}
    await client.submit(MODEL, value(100), parameters=params, correlation_id=rid)


def not_started(result: InferResult) -> bool:
    return result.error is not None and "has not started" in result.error.message


async def test_a_cancelled_start_ends_the_sequence_this_worker_holds(
    settings: PlazaSettings, redis_client: Any
) -> None:
    async with running_worker(settings, MODEL) as worker, PlazaClient(settings) as client:
        key = worker.names.sequence_state_key(MODEL, 1, 60)
        before = [total(await step(client, 60, 5, start=True)), total(await step(client, 60, 6))]
        await send_cancelled_start(client, settings, redis_client, 60)
        after = await step(client, 60, 1)  # read after the START: Kafka keeps their order
        kept = await redis_client.exists(key)
        again = total(await step(client, 60, 2, start=True))
    assert before == [5, 11]
    assert not_started(after), after  # not 12: the sum of the sequence before
    assert kept == 0  # nor left for a worker taking the partition over
    assert again == 2  # a START that runs begins it anew


async def test_a_cancelled_start_drops_the_state_a_worker_before_left(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """The sequence ran on another worker (its partition moved here): this one holds
    nothing of it, and the request after the cancelled START would resume the state that
    worker left under the sequence's key."""
    sent = time.time() - 1  # within the idle time (5 s) of the requests that follow
    old = encode_state({"SUM_IN": np.array([11], np.int32)}, sent, sent)
    key = settings.names.sequence_state_key(MODEL, 1, 61)
    await redis_client.set(key, old)
    async with running_worker(settings, MODEL), PlazaClient(settings) as client:
        await send_cancelled_start(client, settings, redis_client, 61)
        after = await step(client, 61, 1)
        kept = await redis_client.exists(key)
    assert not_started(after), after  # not 12: the sum the worker before left
    assert kept == 0


async def test_a_start_refused_for_room_drops_the_state_before_it(
    settings: PlazaSettings, redis_client: Any, tmp_path: Path
) -> None:
    """With room for one sequence, taken, a START is refused (``queue_full``): its sequence
    has not started, so the state a worker before left under its key goes too."""
    (tmp_path / MODEL).mkdir()
    (tmp_path / MODEL / "1").symlink_to(REPOSITORY / MODEL / "1")
    config = (REPOSITORY / MODEL / "config.pbtxt").read_text()
    one = config.replace("max_candidate_sequences: 256", "max_candidate_sequences: 1")
    assert one != config
    (tmp_path / MODEL / "config.pbtxt").write_text(one)
    settings = settings.model_copy(update={"repository": tmp_path})
    sent = time.time() - 1
    key = settings.names.sequence_state_key(MODEL, 1, 71)
    await redis_client.set(key, encode_state({"SUM_IN": np.array([11], np.int32)}, sent, sent))
    async with running_worker(settings, MODEL), PlazaClient(settings) as client:
        held = total(await step(client, 70, 3, start=True))  # the one sequence, kept open
        refused = await step(client, 71, 4, start=True)
        kept = await redis_client.exists(key)
    assert held == 3
    assert refused.error is not None and refused.error.code == "queue_full", refused
    assert kept == 0
