"""An ensemble over a decoupled step, on the real Kafka and Redis: each response of the step
runs the steps after it, and becomes one response of the ensemble, in the step's order.

The ensemble ``spell`` (decoupled itself): ``pre`` (a simulated copy) -> ``repeat`` (the
decoupled test model: one response per element of its input, then an empty final one, or
its last response final) -> ``post`` (a simulated copy of each response's token). Its
outputs are ``post``'s copy (made once per response) and ``repeat``'s position (taken from
the response itself). A replayed ensemble request, whose decoupled step is answered
already, reads that step's responses from their keys and does not run it again.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc as grpcclient

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_result
from plaza.contract import InferResult
from plaza.naming import step_request_id
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.python_models import write_repository
from tests.support import (
    gateway_fronts,
    make_settings,
    running_worker,
    running_workers,
    wait_for,
    with_model,
)

COPY = """
name: "NAME"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
SPELL = """
name: "spell"
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
      model_name: "pre"
      model_version: -1
      input_map { key: "INPUT0" value: "IN" }
      output_map { key: "OUTPUT0" value: "numbers" }
    },
    {
      model_name: "repeat"
      model_version: -1
      input_map { key: "IN" value: "numbers" }
      output_map { key: "OUT" value: "raw_token" }
      output_map { key: "IDX" value: "POS" }
    },
    {
      model_name: "post"
      model_version: -1
      input_map { key: "INPUT0" value: "raw_token" }
      output_map { key: "OUTPUT0" value: "TOKEN" }
    }
  ]
}
"""

FOREVER = """
name: "forever"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
ensemble_scheduling {
  step [
    {
      model_name: "endless"
      model_version: -1
      input_map { key: "IN" value: "IN" }
      output_map { key: "OUT" value: "counted" }
    },
    {
      model_name: "post"
      model_version: -1
      input_map { key: "INPUT0" value: "counted" }
      output_map { key: "OUTPUT0" value: "COUNT" }
    }
  ]
}
"""


@pytest.fixture
def settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> PlazaSettings:
    root = write_repository(tmp_path / "repository", "repeat", "endless")
    for name, config in (("pre", COPY), ("post", COPY), ("spell", SPELL), ("forever", FOREVER)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config.replace("NAME", name))
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


@asynccontextmanager
async def serving(settings: PlazaSettings) -> AsyncIterator[dict[str, Any]]:
    """Workers of the three step models, and a runner of ``spell`` (under its name)."""
    async with AsyncExitStack() as stack:
        workers = await asyncio.gather(
            *(
                stack.enter_async_context(running_worker(settings, m))
                for m in ("pre", "repeat", "post")
            )
        )
        runner = EnsembleRunner(with_model(settings, "spell"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        yield {**dict(zip(("pre", "repeat", "post"), workers, strict=True)), "spell": runner}


def _spelled(results: list[InferResult]) -> list[tuple[int, int]]:
    out = []
    for r in results:
        arrays = r.as_numpy()
        out.append((int(arrays["TOKEN"].reshape(-1)[0]), int(arrays["POS"].reshape(-1)[0])))
    return out


async def _stream(client: PlazaClient, values: list[int], **options: Any) -> list[InferResult]:
    inputs = {"IN": np.array([values], np.int32)}
    return [
        r
        async for r in client.infer_stream(
            "spell", inputs, raise_on_error=False, timeout_s=60, **options
        )
    ]


async def test_each_response_of_the_decoupled_step_becomes_one_of_the_ensemble(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    async with serving(settings) as workers, PlazaClient(settings) as client:
        three, last_final, none = await asyncio.gather(
            _stream(client, [5, 6, 7], correlation_id="spell-three"),
            _stream(client, [40, 41], parameters={"last_is_final": True}),
            _stream(client, []),
        )
        assert workers["post"].metrics.executions() >= 1
        histogram = workers["spell"].metrics.first_responses["1"]
        assert sum(histogram.buckets) == 2  # the two requests that had a first response
    assert _spelled(three) == [(5, 0), (6, 1), (7, 2)]
    assert [(r.index, r.final, r.model) for r in three] == [
        (0, False, "spell"),
        (1, False, "spell"),
        (2, False, "spell"),
    ]  # the empty final one ends the SDK's stream without being yielded
    assert _spelled(last_final) == [(40, 0), (41, 1)]
    assert [r.final for r in last_final] == [False, True]  # the step's last one was final
    assert none == []  # the step closed the request at once: one empty final response
    names = settings.names
    stored = decode_result(await redis_client.get(names.result_key("spell-three")))
    assert stored.final and stored.empty and stored.index == 3
    for k in range(3):  # the step after the decoupled one ran once per response
        branch = await redis_client.get(names.result_key(step_request_id("spell-three", 2, k)))
        assert branch is not None
        assert decode_result(branch).as_numpy()["OUTPUT0"].reshape(-1).tolist() == [5 + k]
        answer = decode_result(await redis_client.get(names.response_key("spell-three", k)))
        assert answer.index == k and not answer.final


async def test_a_step_error_ends_the_ensemble_after_the_responses_before_it(
    settings: PlazaSettings,
) -> None:
    async with serving(settings), PlazaClient(settings) as client:
        results = await _stream(client, [8, -1, 9])  # repeat answers -1 with an error
    assert _spelled(results[:1]) == [(8, 0)]
    assert len(results) == 2
    failed = results[1]
    assert failed.final and failed.index == 1 and failed.error is not None
    assert failed.error.code == "invalid_input"
    assert failed.error.message == "step 1 (model 'repeat'): element 1 is -1"


async def test_a_replayed_request_reads_the_decoupled_steps_stored_responses(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """As if the runner had died after the steps answered and before its own answers were
    written: the same request again gets the same responses, and repeat does not run."""
    names = settings.names
    async with serving(settings) as workers, PlazaClient(settings) as client:
        first = await _stream(client, [3, 1, 4], correlation_id="spell-replay")
        ran = workers["repeat"].metrics.executions()
        keys = [names.result_key("spell-replay")]
        keys += [names.response_key("spell-replay", k) for k in range(4)]
        assert await redis_client.delete(*keys) == 4  # three responses and the empty final
        stream = client.results_stream("replay")
        req = make_request(
            "spell",
            {"IN": np.array([[3, 1, 4]], np.int32)},
            correlation_id="spell-replay",
            reply_stream=stream,
        )
        await client.publish_many([req])
        again: list[InferResult] = []
        async for _, results in client.consume(stream, "g", "c1", block_ms=500):
            again += results
            if again and again[-1].final:
                break
        assert workers["repeat"].metrics.executions() == ran
    assert _spelled(first) == [(3, 0), (1, 1), (4, 2)]
    assert _spelled(again[:3]) == _spelled(first)
    assert [r.index for r in again] == [0, 1, 2, 3] and again[-1].empty


def _grpc_stream(address: str) -> list[tuple[int | None, bool]]:
    """tritonclient's streaming client against ``spell``: (TOKEN or None, final) per
    response of one request asking for the empty final response."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        item = grpcclient.InferInput("IN", [1, 2], "INT32")
        item.set_data_from_numpy(np.array([[11, 12]], np.int32))
        client.async_stream_infer("spell", [item], enable_empty_final_response=True)
        rows: list[tuple[int | None, bool]] = []
        while not rows or not rows[-1][1]:
            result, error = got.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            token = result.as_numpy("TOKEN")
            rows.append((None if token is None else int(token.reshape(-1)[0]), final))
        return rows
    finally:
        client.stop_stream()
        client.close()


async def test_the_gateway_streams_the_ensembles_responses(settings: PlazaSettings) -> None:
    """tritonclient's gRPC stream and HTTP's generate_stream, through a real gateway."""
    async with serving(settings), gateway_fronts(settings) as gw:
        rows = await asyncio.to_thread(_grpc_stream, gw.grpc_address)
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            answer = await http.post("/v2/models/spell/generate_stream", json={"IN": [21, 22]})
    assert rows == [(11, False), (12, False), (None, True)]
    assert answer.status_code == 200, answer.text
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in answer.content.split(b"\n\n")[:-1]]
    assert [(e["TOKEN"], e["POS"]) for e in events] == [(21, 0), (22, 1)]


async def test_a_caller_that_leaves_cancels_the_decoupled_step(settings: PlazaSettings) -> None:
    """The caller reads three responses of ``forever`` (over ``endless``, which streams
    until cancelled) and leaves: the runner sees the ensemble request answered (cancelled)
    and cancels its step, which the model sees long before its 500 responses."""
    async with AsyncExitStack() as stack:
        for model in ("endless", "post"):
            await stack.enter_async_context(running_worker(settings, model))
        runner = EnsembleRunner(with_model(settings, "forever"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        client = await stack.enter_async_context(PlazaClient(settings))
        counts = []
        inputs = {"IN": np.array([[1]], np.int32)}
        stream = client.infer_stream("forever", inputs, correlation_id="leaving", timeout_s=60)
        async with aclosing(stream) as responses:
            async for result in responses:
                counts.append(int(result.as_numpy()["COUNT"].reshape(-1)[0]))
                if len(counts) == 3:
                    break
        marker = settings.repository / "endless" / f"cancelled-{step_request_id('leaving', 0)}"
        await wait_for(marker.exists, 30, "the step cancelled")
        await wait_for(lambda: runner.in_flight == 0, 30, "the runner let it go")
    assert counts == [0, 1, 2]
    assert int(marker.read_text()) < 500


async def test_a_runner_that_stops_mid_stream_leaves_the_rest_to_the_next(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """Runner a stops (as in a rebalance: its requests in flight cancelled, uncommitted)
    while ``endless`` streams; runner b replays the request with the same step id, finds
    the step's responses on their keys as the step's first run goes on writing them, and
    the caller gets every response once, in order. The step is not cancelled by a's stop."""
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_workers(settings, "endless", "post"))
        first = EnsembleRunner(with_model(settings, "forever", worker_id="runner-a"))
        await first.start()
        client = await stack.enter_async_context(PlazaClient(settings))
        inputs = {"IN": np.array([[1]], np.int32)}
        stream = client.infer_stream("forever", inputs, correlation_id="handover", timeout_s=60)
        counts: list[int] = []
        workers: set[str] = set()
        async with aclosing(stream) as responses:
            async for result in responses:
                counts.append(int(result.as_numpy()["COUNT"].reshape(-1)[0]))
                workers.add(result.worker)
                if len(counts) == 5:
                    await first.stop(drain_timeout_s=0)
                    second = EnsembleRunner(with_model(settings, "forever", worker_id="runner-b"))
                    await second.start()
                    stack.push_async_callback(second.stop)
        step_final = await redis_client.get(settings.names.result_key("handover.0"))
    assert counts == list(range(500))  # each response once, in the step's order
    assert workers == {"runner-a", "runner-b"}
    # the step's first run went to its end (a's stop did not cancel it); b's copy of the
    # step request, queued behind it, found it answered and was cancelled in its turn
    assert decode_result(step_final).index == 500


async def test_a_step_cancelled_by_someone_else_ends_the_ensemble_with_that_error(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """``endless`` streams for the ensemble until its own request is cancelled from outside
    (a ``cancelled`` answer under its step id): the ensemble ends with that error, after
    the responses before it, instead of waiting or ending as if complete."""
    async with AsyncExitStack() as stack:
        for model in ("endless", "post"):
            await stack.enter_async_context(running_worker(settings, model))
        runner = EnsembleRunner(with_model(settings, "forever"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        client = await stack.enter_async_context(PlazaClient(settings))
        store = ResultStore(redis_client, settings.redis, settings.names)
        inputs = {"IN": np.array([[1]], np.int32)}
        stream = client.infer_stream(
            "forever", inputs, correlation_id="outside", timeout_s=60, raise_on_error=False
        )
        results: list[InferResult] = []
        async with aclosing(stream) as responses:
            async for result in responses:
                results.append(result)
                if len(results) == 3:
                    step = make_request("endless", inputs, correlation_id="outside.0")
                    assert await store.cancel(step)
    failed = results[-1]
    assert failed.final and failed.error is not None and failed.error.code == "cancelled"
    assert failed.error.message.startswith("step 0 (model 'endless'): ")
    assert all(r.error is None for r in results[:-1]) and len(results) >= 4
