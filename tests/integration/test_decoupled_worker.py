"""A decoupled model (Triton's ``model_transaction_policy { decoupled: true }``) through a
real worker on real Kafka and Redis.

The model (``repeat``, tests/python_models.py) answers each element of its input as a
response of its own, then closes the request. A pipeline that publishes to Kafka and reads
its result stream sees every response of every request in order, numbered, the last one
final; the responses before it stay on their response keys and the final one on the
result key. A request replayed after its first run wrote some responses (a worker that
died mid-stream) adds only the ones that run did not write: a reader never sees one twice.
Through the gateway, tritonclient's gRPC stream and HTTP's generate_stream pass the real
worker's responses on, and the one-answer infer refuses the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
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
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.workers.writer import ResultWriter
from tests.python_models import write_repository
from tests.support import REPOSITORY, gateway_fronts, make_settings, running_worker, wait_for


@pytest.fixture
def settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> PlazaSettings:
    root = write_repository(tmp_path / "repository", "repeat")
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


def _values(result: InferResult) -> tuple[int, int]:
    out = result.as_numpy()
    return int(out["OUT"][0, 0]), int(out["IDX"][0, 0])


async def _read_until_final(
    client: PlazaClient, stream: str, ids: list[str]
) -> dict[str, list[InferResult]]:
    """Every result on ``stream`` per request id, until each request's final one came."""
    seen: dict[str, list[InferResult]] = {rid: [] for rid in ids}
    closed: set[str] = set()
    async for _, results in client.consume(stream, "g", "c1", block_ms=500):
        for result in results:
            seen[result.id].append(result)
            if result.final:
                closed.add(result.id)
        if closed == set(ids):
            return seen
    raise AssertionError("the stream ended")  # consume never ends by itself


async def test_a_pipeline_reads_every_response_in_order(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    lengths = [3, 1, 0, 5]
    async with PlazaClient(settings) as client:
        stream = client.results_stream("repeat")
        requests = [
            make_request(
                "repeat",
                {"IN": np.arange(10 * n, 10 * n + n, dtype=np.int32).reshape(1, n)},
                reply_stream=stream,
                parameters={"last_is_final": True} if n == 5 else {},
            )
            for n in lengths
        ]
        ids = await client.publish_many(requests)  # queued first: they share a batch
        async with running_worker(settings, "repeat") as worker:
            seen = await _read_until_final(client, stream, ids)
            assert max(worker.metrics.batch_sizes()) > 1
    for rid, n in zip(ids, lengths, strict=True):
        results = seen[rid]
        assert [r.index for r in results] == list(range(len(results)))  # in order, once each
        assert [r.final for r in results] == [False] * (len(results) - 1) + [True]
        answered = [r for r in results if not r.empty]
        assert [_values(r) for r in answered] == [(10 * n + k, k) for k in range(n)]
        # closed by the flag alone (an empty final) unless its last response carried it
        assert results[-1].empty == (n != 5) and len(results) == (n if n == 5 else n + 1)
    names = settings.names
    rid, n = ids[0], lengths[0]
    for k in range(n):  # the responses before the final one: each on its own key
        raw = await redis_client.get(names.response_key(rid, k))
        assert raw is not None and _values(decode_result(raw)) == (30 + k, k)
    final = await redis_client.get(names.result_key(rid))  # the final one: the result key
    assert final is not None and decode_result(final).empty and decode_result(final).index == n
    assert await redis_client.get(names.response_key(rid, n)) is None


async def test_a_replayed_request_adds_only_the_responses_not_yet_written(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """As if a worker had written the first two responses of a request and died: the
    request runs again in full, and the stream gets responses 2.. and the final one."""
    async with PlazaClient(settings) as client:
        stream = client.results_stream("replay")
        req = make_request(
            "repeat", {"IN": np.array([[7, 8, 9, 10]], np.int32)}, reply_stream=stream
        )
        earlier = [
            InferResult(
                req.id,
                "repeat",
                "1",
                (
                    Tensor.from_numpy("OUT", np.array([[100 + k]], np.int32)),
                    Tensor.from_numpy("IDX", np.array([[k]], np.int32)),
                ),
                worker="the-first-run",
                index=k,
                final=False,
            )
            for k in range(2)
        ]
        writer = ResultWriter(redis_client, settings.redis, settings.names)
        try:
            assert await writer.write([(r, stream) for r in earlier]) == 2
        finally:
            await writer.close()
        await client.publish_many([req])
        async with running_worker(settings, "repeat"):
            seen = (await _read_until_final(client, stream, [req.id]))[req.id]
    assert [r.index for r in seen] == [0, 1, 2, 3, 4]  # each response once
    assert [r.worker for r in seen[:2]] == ["the-first-run"] * 2  # first write wins
    assert [_values(r) for r in seen[:4]] == [(100, 0), (101, 1), (9, 2), (10, 3)]
    assert seen[4].final and seen[4].empty


def _grpc_stream(address: str) -> list[tuple[int | None, bool]]:
    """tritonclient's streaming client against ``repeat``: (OUT or None, final) per response
    of one request asking for the empty final response."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        item = grpcclient.InferInput("IN", [1, 3], "INT32")
        item.set_data_from_numpy(np.array([[4, 5, 6]], np.int32))
        client.async_stream_infer("repeat", [item], enable_empty_final_response=True)
        rows: list[tuple[int | None, bool]] = []
        while not rows or not rows[-1][1]:
            result, error = got.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            out = result.as_numpy("OUT")
            rows.append((None if out is None else int(out[0, 0]), final))
        return rows
    finally:
        client.stop_stream()
        client.close()


async def test_the_gateway_streams_a_real_workers_responses(settings: PlazaSettings) -> None:
    """gRPC's ModelStreamInfer (tritonclient) and HTTP's generate_stream, end to end."""
    async with running_worker(settings, "repeat"), gateway_fronts(settings) as gw:
        rows = await asyncio.to_thread(_grpc_stream, gw.grpc_address)
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            answer = await http.post("/v2/models/repeat/generate_stream", json={"IN": [7, 8]})
            refused = await http.post(
                "/v2/models/repeat/infer",
                json={
                    "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [1]}]
                },
            )
    assert rows == [(4, False), (5, False), (6, False), (None, True)]
    assert answer.status_code == 200, answer.text
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in answer.content.split(b"\n\n")[:-1]]
    assert [(e["OUT"], e["IDX"]) for e in events] == [(7, 0), (8, 1)]  # the empty final: no event
    assert refused.status_code == 400 and "decoupled" in refused.json()["error"]


async def test_the_sample_words_streams_a_text_word_by_word(
    kafka_bootstrap: str, redis_url: str, unique_id: str, redis_client: object
) -> None:
    """``model_repository/words`` (built by ``make models``) through generate_stream and the
    SDK's infer_stream."""
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=REPOSITORY)
    text = "the plaza merges   cars"
    async with running_worker(settings, "words"), gateway_fronts(settings) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            answer = await http.post("/v2/models/words/generate_stream", json={"TEXT": text})
        async with PlazaClient(settings) as client:
            texts = np.array([[b"no words? no: two"], [b"  "]], dtype=np.object_)
            first = [r async for r in client.infer_stream("words", {"TEXT": texts[:1]})]
            none = [r async for r in client.infer_stream("words", {"TEXT": texts[1:]})]
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in answer.content.split(b"\n\n")[:-1]]
    assert [(e["WORD"], e["INDEX"]) for e in events] == [
        ("the", 0), ("plaza", 1), ("merges", 2), ("cars", 3),
    ]  # fmt: skip
    assert [r.as_numpy()["WORD"][0, 0] for r in first] == [b"no", b"words?", b"no:", b"two"]
    assert first[-1].final and [r.index for r in first] == [0, 1, 2, 3]
    assert none == []  # closed without a response: the SDK leaves the empty final out


async def test_a_caller_that_goes_away_stops_a_running_decoupled_request(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    """The SDK stream left after three responses stores a ``cancelled`` answer; the worker
    finds it and tells the model, whose ``is_cancelled`` turns True while it sends."""
    root = write_repository(tmp_path / "repository", "endless")
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    async with running_worker(settings, "endless"), PlazaClient(settings) as client:
        got: list[InferResult] = []
        responses = client.infer_stream("endless", {"IN": np.array([[0]], np.int32)})
        async with contextlib.aclosing(responses):
            async for result in responses:
                got.append(result)
                if len(got) == 3:
                    break
        rid = got[0].id
        marker = root / "endless" / f"cancelled-{rid}"
        await wait_for(marker.exists, 30, "the model to see its request cancelled")
        status = await client.poll(rid)
    assert 3 <= int(marker.read_text()) < 500  # it stopped long before its 500th response
    assert status.result is not None and status.result.error is not None
    assert status.result.error.code == "cancelled"  # the caller's answer, not the model's
