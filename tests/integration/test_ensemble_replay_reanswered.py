"""A retry under an answered ensemble request's id gets the stored answer, on real Kafka and
Redis.

A producer may retry a request under the same correlation id (docs/protocol.md, "a
retry"). The ensemble runner finds it answered and does not run it again, but, as a worker
does, it sends the stored answer to the reply stream the retry names, where the retry's
caller waits: a decoupled ensemble's stored responses, then its final one. A record replayed
as it was sent (after a crash or a rebalance, sent before its answer was stored) and a
request its caller cancelled get no copy (``workers/ensemble.py``, ``workers/answered.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_results, encode_request
from plaza.connections import kafka_producer
from plaza.contract import InferRequest, InferResult
from plaza.naming import STREAM_FIELD_RESULTS
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.ensemble_configs import FOUR
from tests.python_models import write_repository
from tests.support import group_offsets, running_worker, wait_for, with_model

RETRY_TIMEOUT_S = 20.0
"""Generous: without the stored answer sent again, the retry waits all of it and raises."""

TWICE = """
name: "twice"
platform: "ensemble"
max_batch_size: 64
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "four"
      model_version: -1
      input_map { key: "INPUT0" value: "X" }
      output_map { key: "OUTPUT0" value: "middle" }
    },
    {
      model_name: "four"
      model_version: -1
      input_map { key: "INPUT0" value: "middle" }
      output_map { key: "OUTPUT0" value: "Y" }
    }
  ]
}
"""
ECHO = """
name: "echo"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "POS" data_type: TYPE_INT32 dims: [ 1 ] }
]
model_transaction_policy { decoupled: true }
ensemble_scheduling {
  step [
    {
      model_name: "repeat"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "OUT" value: "TOKEN" }
      output_map { key: "IDX" value: "POS" }
    }
  ]
}
"""


def _repository(root: Path, decoupled: bool) -> Path:
    configs = {"echo": ECHO} if decoupled else {"four": FOUR, "twice": TWICE}
    if decoupled:
        write_repository(root, "repeat")
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


@asynccontextmanager
async def _serving(
    settings: PlazaSettings, step: str, ensemble: str
) -> AsyncIterator[tuple[Any, EnsembleRunner]]:
    """The step model's worker and the ensemble's runner."""
    runner = EnsembleRunner(with_model(settings, ensemble))
    async with running_worker(settings, step) as worker:
        await runner.start()
        try:
            yield worker, runner
        finally:
            await runner.stop()


async def test_a_retried_ensemble_request_gets_the_stored_answer(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": _repository(tmp_path / "repo", False)})
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    async with _serving(settings, "four", "twice") as (worker, runner), PlazaClient(settings) as c:
        first = await c.infer("twice", {"X": x}, correlation_id="retried")
        ran = worker.metrics.executions()
        again = await c.infer(
            "twice", {"X": x}, correlation_id="retried", timeout_s=RETRY_TIMEOUT_S
        )
        assert again == first  # the stored answer, byte for byte (its timings, its runner)
        assert worker.metrics.executions() == ran == 2  # each step ran once, for the first
        assert runner.metrics.version("1").success.count == 1  # the retry counts nothing
    np.testing.assert_array_equal(again.output("Y").to_numpy(), x)


async def test_a_retried_decoupled_ensemble_request_gets_every_stored_response(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": _repository(tmp_path / "repo", True)})
    inputs = {"IN": np.array([[7, 8, 9]], np.int32)}

    async def responses(client: PlazaClient, timeout_s: float = 60.0) -> list[InferResult]:
        stream = client.infer_stream("echo", inputs, correlation_id="streamed", timeout_s=timeout_s)
        return [r async for r in stream]

    async with _serving(settings, "repeat", "echo") as (worker, _), PlazaClient(settings) as c:
        first = await responses(c)
        again = await responses(c, RETRY_TIMEOUT_S)
        assert worker.metrics.executions() == 1  # the decoupled step ran once
    assert [int(r.as_numpy()["TOKEN"][0, 0]) for r in first if not r.empty] == [7, 8, 9]
    assert again == first


async def test_a_replayed_record_and_a_cancelled_request_get_no_copy(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": _repository(tmp_path / "repo", False)})
    x = np.ones((1, 4), np.float32)
    async with _serving(settings, "four", "twice") as (worker, runner), PlazaClient(settings) as c:
        stream = c.results_stream("replays")

        def request(rid: str) -> InferRequest:
            return make_request("twice", {"X": x}, reply_stream=stream, correlation_id=rid)

        # The same record twice, as Kafka delivers it again after a crash: sent (sent_us, a
        # second back here) before its answer was stored, and on the stream with that answer.
        replayed = encode_request(request("replayed"), sent_us=time.time_ns() // 1000 - 1_000_000)
        topic = settings.names.request_topic("twice")
        producer = kafka_producer(settings.kafka)
        await producer.start()
        try:
            await producer.send_and_wait(topic, replayed, key=b"replayed")
            await _stream_results(c._redis, stream, 1)
            await producer.send_and_wait(topic, replayed, key=b"replayed")
        finally:
            await producer.stop()
        cancelled = request("cancelled")
        assert await ResultStore(c._redis, settings.redis, settings.names).cancel(cancelled)
        await c.publish_many([cancelled, request("fresh")])  # sent after its cancel: no copy
        await _stream_results(c._redis, stream, 2)
        # Every record finished (a copy goes to its stream before its record is): committed.
        await wait_for(lambda: _all_committed(settings, runner), 60, "the records committed")
        results = await _stream_results(c._redis, stream, 2)
        assert [res.id for res in results] == ["replayed", "fresh"]
        assert worker.metrics.executions() == 4  # two steps each, for replayed and fresh


async def _all_committed(settings: PlazaSettings, runner: EnsembleRunner) -> bool:
    tps = sorted(runner.consumer.assignment())
    offsets = await group_offsets(settings, "twice", tps)
    return bool(tps) and all(committed == end for committed, end in offsets.values())


async def _stream_results(r: aioredis.Redis, stream: str, count: int) -> list[InferResult]:
    """The answers on ``stream``, once there are at least ``count``."""
    found: list[InferResult] = []

    async def there() -> bool:
        entries: Any = await r.xrange(stream)
        found[:] = [
            res for _, fields in entries for res in decode_results(fields[STREAM_FIELD_RESULTS])
        ]
        return len(found) >= count

    await wait_for(there, 60, f"{count} answers on {stream}")
    return found
