"""Decoupled streaming on real Kafka and Redis, where it used to go wrong.

- A caller that keeps up gets every response of a fast decoupled model: a worker puts at
  most ``MAX_ENTRY_RESPONSES`` of one request in a reply stream entry, and the reply reader
  judges a stream's bound only after its reader had a turn (an entry is handed over whole).
  A reader that does not keep up is still cut off, holding its limit plus one entry at most.
- A request cancelled while its batch waits for the model's instance is skipped.
- A mid-stream timeout names the job to poll (SSE error event, gRPC stream error response).
- Every gRPC stream response carries ``triton_final_response``, as Triton's do.
- The sample ``words`` answers every row of a batched request.

``talker`` (below) is a decoupled Python model: ``IN = [n, how]`` sends ``OUT = [i]`` for
``i < n``, then closes the request: empty (``how`` 0), with an error (1), or, for ``how``
2 and up, once the file ``go-<how>`` exists in its folder (a stalled model).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import redis.asyncio
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.batching import DynamicBatcher
from plaza.client import PlazaClient, make_request
from plaza.codec import decode_results, encode_results
from plaza.connections import redis_client as connect_redis
from plaza.contract import InferResult
from plaza.errors import QueueFull
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.replies import ReplyMux, ResponseStream
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.workers.answered import RECHECK_AFTER_S
from plaza.workers.worker import Worker
from plaza.workers.writer import MAX_ENTRY_RESPONSES, ResultWriter
from tests.python_models import write_model
from tests.support import REPOSITORY, gateway_fronts, make_settings, running_worker, wait_for

pytestmark = pytest.mark.timeout(180)

TALKER_CONFIG = """
name: "talker"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
TALKER_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            n, how = (int(v) for v in request.inputs()[0].as_numpy())
            sender = request.get_response_sender()
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            if how == 1:
                error = pb_utils.TritonError("talker: boom")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            go = os.path.join(self.folder, "go-%d" % how)
            t0 = time.monotonic()
            while how >= 2 and not os.path.exists(go) and time.monotonic() - t0 < 60:
                time.sleep(0.01)
            sender.send(flags=FINAL)
        return None
"""
HOLD_CONFIG = """
name: "hold"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
HOLD_MODEL = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Echoes IN as OUT, leaving the file ran-<IN> in its folder; IN -1 holds the instance
    until its request is cancelled (at most 60 s), the file waiting there meanwhile."""

    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(request.inputs()[0].as_numpy()[0])
            open(os.path.join(self.folder, "ran-%d" % value), "w").close()
            t0 = time.monotonic()
            while value == -1 and not request.is_cancelled() and time.monotonic() - t0 < 60:
                time.sleep(0.01)
            out = pb_utils.Tensor("OUT", np.array([value], np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
'''


@pytest.fixture
def root(tmp_path: Path) -> Path:
    repository = tmp_path / "repository"
    write_model(repository, "talker", TALKER_CONFIG, TALKER_MODEL)
    return write_model(repository, "hold", HOLD_CONFIG, HOLD_MODEL)


@pytest.fixture
def streaming(
    kafka_bootstrap: str, redis_url: str, unique_id: str, root: Path, redis_client: object
) -> PlazaSettings:
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


def response(rid: str, index: int, final: bool = False) -> InferResult:
    return InferResult(rid, "talker", "1", index=index, final=final)


# -- the reply stream's bound ----------------------------------------------------------------
async def entries_written(client: redis.asyncio.Redis, settings: PlazaSettings) -> list[Any]:
    """The entries (each its results) of one stream after three writes: 600 responses of
    ``a`` and 300 ordinary results, then the 300 again (replays), then 300 more."""
    stream = settings.names.reply_stream("fixes")
    many = [response("a", i) for i in range(600)]
    ordinary = [response(f"b{k}", 0, final=True) for k in range(300)]
    writer = ResultWriter(client, settings.redis, settings.names)
    try:
        await writer.write([(r, stream) for r in [*many, *ordinary]])
        replays = [InferResult(r.id, r.model, "1", final=True, worker="w2") for r in ordinary]
        await writer.write([(r, stream) for r in replays])  # no entry: first write wins
        await writer.write([(response(f"c{k}", 0, final=True), stream) for k in range(300)])
    finally:
        await writer.close()
    added: Any = await client.xrange(stream)
    return [
        decode_results(fields[STREAM_FIELD_RESULTS], int(fields[STREAM_FIELD_COUNT]))
        for _, fields in added
    ]


def assert_capped(entries: list[Any]) -> None:
    assert [len(e) for e in entries] == [256, 256, 88 + 300, 300]  # a batch: one entry
    assert max(sum(r.id == "a" for r in e) for e in entries) == MAX_ENTRY_RESPONSES
    flat = [(r.id, r.index) for e in entries[:3] for r in e]
    expected = [("a", i) for i in range(600)] + [(f"b{k}", 0) for k in range(300)]
    assert flat == expected  # in order


async def test_the_worker_puts_a_requests_many_responses_into_several_entries(
    streaming: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    assert_capped(await entries_written(redis_client, streaming))


async def test_so_does_a_worker_on_a_redis_cluster(cluster_settings: PlazaSettings) -> None:
    client = connect_redis(cluster_settings.redis)
    try:
        assert_capped(await entries_written(client, cluster_settings))
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def reading(
    redis_client: redis.asyncio.Redis, stream: str, limit: int, entries: list[bytes]
) -> AsyncIterator[ResponseStream]:
    """A reply reader on ``stream`` with request ``a`` expected (at most ``limit``
    waiting), the ``entries`` (result batches) added before it reads: one read gets them."""
    for packed in entries:
        n = len(decode_results(packed))
        await redis_client.xadd(stream, {STREAM_FIELD_COUNT: n, STREAM_FIELD_RESULTS: packed})
    mux = ReplyMux(redis_client, stream, ttl_s=60, maxlen=10_000)
    responses = mux.expect_responses("a", limit)
    await mux.start()
    try:
        yield responses
    finally:
        await mux.stop()


async def test_a_reader_that_keeps_up_takes_an_entry_far_past_its_limit(
    streaming: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    """An entry of 3,000 responses (a worker of before the cap, or a producer's own) is
    handed over whole; its reader takes them on its turn, so the stream is not cut off."""
    stream = f"{streaming.redis.key_prefix}replies"
    entry = encode_results([response("a", i, final=i == 2999) for i in range(3000)])
    async with reading(redis_client, stream, 1024, [entry]) as responses:
        async with asyncio.timeout(30):
            got = [r.index async for r in responses]
    assert got == list(range(3000))


async def test_a_reader_that_does_not_keep_up_holds_its_limit_and_one_entry_at_most(
    streaming: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    """Three entries of 60 in one read, a limit of 100, a reader that takes nothing: the
    second entry takes it past the limit, the reader loop reads again (the reader's turn),
    finds it still past and ends it with QueueFull; the third entry is dropped."""
    stream = f"{streaming.redis.key_prefix}replies"
    entries = [encode_results([response("a", i) for i in range(k, k + 60)]) for k in (0, 60, 120)]
    got: list[int] = []
    async with reading(redis_client, stream, 100, entries) as responses:
        await wait_for(lambda: responses.ended, 30, "the stream to be cut off")
        with pytest.raises(QueueFull, match="120 responses waited undelivered"):
            async with asyncio.timeout(30):
                async for result in responses:
                    got.append(result.index)
    assert got == list(range(120))


def _grpc_burst(address: str, count: int) -> tuple[list[int], list[bool], list[str]]:
    """tritonclient's stream to talker for ``count`` responses and the empty final one:
    OUT and triton_final_response per response, and the errors."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        item = grpcclient.InferInput("IN", [2], "INT32")
        item.set_data_from_numpy(np.array([count, 0], np.int32))
        client.async_stream_infer("talker", [item], enable_empty_final_response=True)
        values: list[int] = []
        finals: list[bool] = []
        while not finals or not finals[-1]:
            result, error = got.get(timeout=60)
            if error is not None:
                return values, finals, [str(error)]
            finals.append(result.get_response().parameters["triton_final_response"].bool_param)
            out = result.as_numpy("OUT")
            values.extend([] if out is None else out.tolist())
        return values, finals, []
    finally:
        client.stop_stream()
        client.close()


async def test_callers_that_keep_up_get_every_response_of_a_fast_decoupled_model(
    streaming: PlazaSettings,
) -> None:
    count = 5000
    async with running_worker(streaming, "talker"), gateway_fronts(streaming) as gw:
        values, finals, errors = await asyncio.to_thread(_grpc_burst, gw.grpc_address, count)
        async with PlazaClient(streaming) as client:
            x = {"IN": np.array([count, 0], np.int32)}
            sdk = [int(r.as_numpy()["OUT"][0]) async for r in client.infer_stream("talker", x)]
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            sse = await http.post("/v2/models/talker/generate_stream", json={"IN": [count, 0]})
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in sse.content.split(b"\n\n")[:-1]]
    assert [e.get("OUT", e) for e in events] == list(range(count))
    assert errors == []
    assert values == list(range(count))
    assert finals == [False] * count + [True]  # the empty final one asked for, last
    assert sdk == list(range(count))


# -- cancelled while waiting for the instance ----------------------------------------------
def held_past_the_recheck_window(worker: Worker) -> bool:
    """Whether the worker's batcher holds one request, looked at its intake more than
    RECHECK_AFTER_S ago: a batch of it looks for answers again before it runs."""
    assert isinstance(worker.batcher, DynamicBatcher)
    held = [p.item for q in worker.batcher._order for p in q if p.alive]
    looked = held[0].looked_at if len(held) == 1 else None
    return looked is not None and time.monotonic() - looked > RECHECK_AFTER_S


async def test_a_request_cancelled_while_its_batch_waits_for_the_instance_is_skipped(
    streaming: PlazaSettings, root: Path, redis_client: redis.asyncio.Redis
) -> None:
    store = ResultStore(redis_client, streaming.redis, streaming.names)
    async with running_worker(streaming, "hold") as worker, PlazaClient(streaming) as client:
        holder = make_request("hold", {"IN": np.array([-1], np.int32)})
        late = make_request("hold", {"IN": np.array([7], np.int32)})
        await client.publish_many([holder])
        await wait_for((root / "hold" / "ran--1").exists, 60, "the instance to be held")
        await client.publish_many([late])
        # It waits in the batcher for the instance (a batch forms once one is free), past
        # the window in which a batch runs without looking for answers again (a cancel in
        # the last RECHECK_AFTER_S before it runs may lose: docs/guarantees.md).
        await wait_for(lambda: held_past_the_recheck_window(worker), 30, "the late one to wait")
        assert await store.cancel(late)
        assert await store.cancel(holder)  # the instance is free once the model sees it
        # the holder's end frees the instance; only then does the late one's batch form
        # (in flight 0 in between), and the look before it runs finds the cancel
        await wait_for(
            lambda: worker.metrics.records["skipped"] == 1 and worker._in_flight == 0,
            30,
            "the late one to be skipped and both finished",
        )
        status = await client.poll(late.id)
    assert not (root / "hold" / "ran-7").exists()  # never ran
    assert status.result is not None and status.result.error is not None
    assert status.result.error.code == "cancelled"


# -- what a stream's responses say -----------------------------------------------------------
def stream_request(model: str, values: list[int], rid: str, **params: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=rid)
    request.inputs.add(name="IN", datatype="INT32", shape=[len(values)])
    request.raw_input_contents.append(np.array(values, np.int32).tobytes())
    for key, value in params.items():
        kind = "bool_param" if isinstance(value, bool) else "int64_param"
        setattr(request.parameters[key], kind, value)
    return request


async def stream_answers(
    address: str, requests: list[pb.ModelInferRequest]
) -> dict[str, list[tuple[Any, ...]]]:
    """Per request id: (OUT or None, error text, its parameters) per stream response."""
    got: dict[str, list[tuple[Any, ...]]] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        async with asyncio.timeout(60):
            async for answer in stub.ModelStreamInfer(iter(requests)):
                r = answer.infer_response
                out = (
                    int(np.frombuffer(r.raw_output_contents[0], np.int32)[0]) if r.outputs else None
                )
                params = {
                    k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in r.parameters.items()
                }
                got.setdefault(r.id, []).append((out, answer.error_message, params))
    return got


async def test_every_stream_response_says_whether_it_is_its_requests_last(
    streaming: PlazaSettings,
) -> None:
    """Without ``triton_enable_empty_final_response`` too, as Triton: that opt-in only
    decides whether an empty final response is sent."""
    requests = [
        stream_request("talker", [2, 0], "plain"),
        stream_request("talker", [1, 0], "asked", triton_enable_empty_final_response=True),
        stream_request("talker", [1, 1], "failing"),
        stream_request("talker", [1, 2, 3], "refused"),  # not IN's dims: refused at once
        stream_request("hold", [5], "ordinary"),
    ]
    async with (
        running_worker(streaming, "talker"),
        running_worker(streaming, "hold"),
        gateway_fronts(streaming) as gw,
    ):
        got = await stream_answers(gw.grpc_address, requests)
    final = "triton_final_response"
    assert got["plain"] == [(0, "", {final: False}), (1, "", {final: False})]  # no empty one
    assert got["asked"] == [(0, "", {final: False}), (None, "", {final: True})]
    assert got["failing"] == [(0, "", {final: False}), (None, "talker: boom", {final: True})]
    [(_, refused, params)] = got["refused"]
    assert "IN" in refused and params == {final: True}
    assert got["ordinary"] == [(5, "", {final: True})]


async def test_a_mid_stream_timeout_names_the_job_to_poll(
    streaming: PlazaSettings, root: Path
) -> None:
    """The first response comes, the next not within the request's timeout: the SSE error
    event (as an HTTP error body) and the gRPC stream's error response carry the job id,
    and the job, polled once the model goes on, holds every response."""
    async with (
        running_worker(streaming, "talker"),
        gateway_fronts(streaming) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        body = {"IN": [1, 2], "parameters": {"timeout": 500_000}}
        sse = await http.post("/v2/models/talker/generate_stream", json=body)
        (root / "talker" / "go-2").touch()
        stalled = stream_request("talker", [1, 3], "g", timeout=500_000)
        streamed = (await stream_answers(gw.grpc_address, [stalled]))["g"]
        (root / "talker" / "go-3").touch()
        events = [orjson.loads(e.removeprefix(b"data: ")) for e in sse.content.split(b"\n\n")[:-1]]
        jobs = [events[-1].get("job_id"), streamed[-1][2].get("job_id")]
        polled = []
        for job_id in jobs:
            assert isinstance(job_id, str)

            async def done(job: str = job_id) -> bool:
                status: Any = (await http.get(f"/v2/jobs/{job}")).json()
                return bool(status["status"] == "done")

            await wait_for(done, 60, "the stalled job to finish")
            polled.append((await http.get(f"/v2/jobs/{job_id}")).json())
    assert sse.status_code == 200 and events[0]["OUT"] == 0
    assert events[-1]["code"] == "timeout" and "job_id" in events[-1]
    assert streamed[0][:2] == (0, "")
    assert "no response within 0.5 s" in streamed[-1][1] and jobs[1] in streamed[-1][1]
    assert streamed[-1][2]["triton_final_response"] is True
    for job in polled:
        assert [r["outputs"][0]["data"] for r in job["responses"]] == [[0]]


# -- the sample words --------------------------------------------------------------------------
async def test_words_answers_every_row_of_a_batched_request(
    kafka_bootstrap: str, redis_url: str, unique_id: str, redis_client: object
) -> None:
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, repository=REPOSITORY)
    texts = np.array([[b"two words"], [b"three"], [b"  "]], dtype=np.object_)
    async with running_worker(settings, "words"), PlazaClient(settings) as client:
        got = [r async for r in client.infer_stream("words", {"TEXT": texts})]
    rows = [(r.as_numpy()["WORD"].tolist(), r.as_numpy()["INDEX"].tolist()) for r in got]
    assert rows == [([[b"two"]], [[0]]), ([[b"words"]], [[1]]), ([[b"three"]], [[0]])]
    assert [r.final for r in got] == [False, False, True]  # the empty last row: no response
