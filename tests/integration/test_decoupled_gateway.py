"""A decoupled model's many responses through the gateway and the SDK, on real Kafka and Redis.

No worker runs the model: ``Responder`` plays one exactly where a worker meets the rest of
Plaza. It reads the model's request topic and writes each request's responses with the real
``ResultWriter`` (non-final ones under their response keys, the final one under the result
key, every one onto the request's reply stream). A request's input says what it gets:
``IN = [count, how]``: ``count`` responses (``OUT = [i]``), then a final one that is empty
(``how`` 0), carries ``OUT = [count]`` (1), or is an error (2).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
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
from aiokafka import TopicPartition
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.client import PlazaClient, SyncPlazaClient
from plaza.codec import decode_request, decode_result
from plaza.connections import kafka_consumer
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import Unsupported
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.workers.writer import ResultWriter
from tests.support import gateway_fronts, wait_for

pytestmark = pytest.mark.timeout(120)

MODEL = "stream"
CONFIG = """
name: "stream"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
EMPTY, DATA, ERROR = 0, 1, 2


@pytest.fixture
def decoupled_settings(
    settings: PlazaSettings, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> PlazaSettings:
    """Settings serving only ``stream`` (a decoupled Python model no worker runs)."""
    root = tmp_path / "repo"
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG.lstrip())
    (root / MODEL / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    return settings.model_copy(update={"repository": root})


def out(value: int) -> tuple[Tensor, ...]:
    return (Tensor.from_numpy("OUT", np.array([value], np.int32)),)


class Responder:
    """Answers ``stream``'s requests as its worker would. After a request's first response
    it waits for ``gate`` (set by default), so a test can see that one arrive alone."""

    def __init__(self, settings: PlazaSettings, redis_client: redis.asyncio.Redis) -> None:
        self._settings = settings
        self._writer = ResultWriter(redis_client, settings.redis, settings.names)
        self._consumer = kafka_consumer(settings.kafka, f"{settings.kafka.topic_prefix}fake")
        self.requests: list[InferRequest] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    assert record.value is not None
                    req = decode_request(record.value)
                    self.requests.append(req)
                    task = asyncio.create_task(self._answer(req))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _answer(self, req: InferRequest) -> None:
        count, how = req.inputs[0].to_numpy().tolist()
        stream = req.reply.stream
        for i in range(count):
            response = InferResult(req.id, req.model, "1", out(i), index=i, final=False)
            await self._writer.write([(response, stream)])
            await self.gate.wait()
        final = {
            EMPTY: InferResult(req.id, req.model, "1", index=count, empty=True),
            DATA: InferResult(req.id, req.model, "1", out(count), index=count),
            ERROR: InferResult(
                req.id, req.model, "1", index=count, error=ErrorInfo("model_error", "boom")
            ),
        }[how]
        await self._writer.write([(final, stream)])

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Responder]:
        await self._consumer.start()
        topic = self._settings.names.request_topic(MODEL)
        self._consumer.assign(
            [TopicPartition(topic, p) for p in range(self._settings.kafka.partitions)]
        )
        task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            task.cancel()
            for t in [task, *self._tasks]:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self._consumer.stop()


@contextlib.asynccontextmanager
async def served(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> AsyncIterator[tuple[Any, Responder]]:
    """The gateway's fronts (the request topics exist once it has started) and a responder."""
    async with gateway_fronts(settings) as gw, Responder(settings, redis_client).running() as r:
        yield gw, r


def grpc_input(count: int, how: int) -> list[grpcclient.InferInput]:
    item = grpcclient.InferInput("IN", [2], "INT32")
    item.set_data_from_numpy(np.array([count, how], np.int32))
    return [item]


def streamed(client_address: str, gate: asyncio.Event, loop: asyncio.AbstractEventLoop) -> Any:
    """tritonclient's own streaming client, on its threads: two requests on one stream,
    ``r1`` with ``enable_empty_final_response``; every response (or error) as it came."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(client_address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(
            MODEL, grpc_input(3, EMPTY), request_id="r1", enable_empty_final_response=True
        )
        first = got.get(timeout=30)  # r1's response 0 came alone: the responder waits
        loop.call_soon_threadsafe(gate.set)
        client.async_stream_infer(MODEL, grpc_input(2, EMPTY), request_id="r2")
        client.async_stream_infer(MODEL, grpc_input(1, ERROR), request_id="r3")
        rest = [got.get(timeout=30) for _ in range(3 + 2 + 2)]
        return [first, *rest]
    finally:
        client.stop_stream()
        client.close()


def described(result: Any, error: Any) -> tuple[str, Any, Any]:
    """(request id, OUT value or error text, triton_final_response or None)."""
    if error is not None:
        return "?", str(error), None
    response = result.get_response()
    final = response.parameters.get("triton_final_response")
    value = result.as_numpy("OUT")
    return (
        response.id,
        None if value is None else int(value[0]),
        (None if final is None else final.bool_param),
    )


async def test_the_grpc_stream_relays_each_response_as_it_comes(
    decoupled_settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    async with served(decoupled_settings, redis_client) as (gw, responder):
        responder.gate.clear()
        loop = asyncio.get_running_loop()
        got = await asyncio.to_thread(streamed, gw.grpc_address, responder.gate, loop)
        async with grpc.aio.insecure_channel(gw.grpc_address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name=MODEL)
            request.inputs.add(name="IN", datatype="INT32", shape=[2])
            request.raw_input_contents.append(np.array([1, DATA], np.int32).tobytes())
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelInfer(request)
        published = len(responder.requests)
    rows = [described(result, error) for result, error in got]
    assert rows[0] == ("r1", 0, False)
    by_request = {rid: [row[1:] for row in rows if row[0] == rid] for rid in ("r1", "r2")}
    # with the empty final response asked for: each marked, the empty one sent last
    assert by_request["r1"] == [(0, False), (1, False), (2, False), (None, True)]
    # without it: marked all the same (as Triton), and no empty response
    assert by_request["r2"] == [(0, False), (1, False)]
    assert ("?", "boom", None) in rows and rows.index(("?", "boom", None)) > 0
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )
    assert published == 3  # the unary call was refused before it was published


async def sse(response: httpx.Response) -> list[Any]:
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = response.content.split(b"\n\n")
    assert events[-1] == b""
    return [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]


async def test_http_refuses_infer_and_generate_and_streams_generate_stream(
    decoupled_settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [2, DATA]}]}
    async with (
        served(decoupled_settings, redis_client) as (gw, responder),
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        infer = await http.post(f"/v2/models/{MODEL}/infer", json=body)
        generate = await http.post(f"/v2/models/{MODEL}/generate", json={"IN": [2, DATA]})
        assert not responder.requests  # refused before publishing
        three = await http.post(
            f"/v2/models/{MODEL}/generate_stream", json={"IN": [3, EMPTY], "id": "g"}
        )
        broken = await http.post(f"/v2/models/{MODEL}/generate_stream", json={"IN": [1, ERROR]})
        at_once = await http.post(f"/v2/models/{MODEL}/generate_stream", json={"IN": [0, ERROR]})
    assert infer.status_code == 400
    assert infer.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy",
        "code": "unsupported",
    }
    assert generate.status_code == 400 and "use generate_stream" in generate.json()["error"]
    assert three.status_code == 200
    assert await sse(three) == [
        {"model_name": MODEL, "model_version": "1", "id": "g", "OUT": i} for i in range(3)
    ]
    # an error after the first event is the stream's last event
    assert await sse(broken) == [
        {"model_name": MODEL, "model_version": "1", "OUT": 0},
        {"error": "boom", "code": "model_error"},
    ]
    # an error before any: a JSON error with its status (model_error: 500)
    assert at_once.status_code == 500 and at_once.json()["error"] == "boom"


async def test_a_decoupled_job_polls_as_all_its_responses(
    decoupled_settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    def body(count: int, how: int) -> dict[str, Any]:
        return {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [count, how]}]}

    async with (
        served(decoupled_settings, redis_client) as (gw, _),
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        jobs = {}
        for name, count, how in (("data", 2, DATA), ("empty", 2, EMPTY), ("error", 1, ERROR)):
            submitted = await http.post(f"/v2/models/{MODEL}/jobs", json=body(count, how))
            assert submitted.status_code == 202, submitted.text
            jobs[name] = submitted.json()["job_id"]
        polled: dict[str, Any] = {}
        for name, job_id in jobs.items():

            async def done(name: str = name, job_id: str = job_id) -> bool:
                polled[name] = (await http.get(f"/v2/jobs/{job_id}")).json()
                return bool(polled[name]["status"] != "pending")

            await wait_for(done, 30, f"job {name} to be answered")
        binary = await http.get(f"/v2/jobs/{jobs['data']}?binary_data_output=true")

    def values(doc: dict[str, Any]) -> list[Any]:
        return [r["outputs"][0]["data"] if "outputs" in r else r for r in doc["responses"]]

    data = polled["data"]
    assert data["status"] == "done" and data["job_id"] == jobs["data"]
    assert (data["model_name"], data["model_version"]) == (MODEL, "1")
    assert values(data) == [[0], [1], [2]]  # the final response last
    assert data["responses"][0]["id"] == jobs["data"]
    assert data["responses"][0]["outputs"][0]["shape"] == [1]
    assert polled["empty"]["status"] == "done" and values(polled["empty"]) == [[0], [1]]
    error = polled["error"]
    assert (error["status"], error["error"], error["code"]) == ("error", "boom", "model_error")
    assert values(error) == [[0]]
    # asked binary: each response's outputs after the JSON header, in order
    assert binary.status_code == 200, binary.text
    length = int(binary.headers["Inference-Header-Content-Length"])
    header = orjson.loads(binary.content[:length])
    assert [r["outputs"][0]["parameters"]["binary_data_size"] for r in header["responses"]] == [
        4
    ] * 3
    assert np.frombuffer(binary.content[length:], "<i4").tolist() == [0, 1, 2]


async def test_a_decoupled_job_of_one_response_polls_as_decoupled_where_its_model_is_not_loaded(
    decoupled_settings: PlazaSettings, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    """A decoupled job whose only response is its final one (index 0, with data) looks
    like an ordinary job's answer: the job's marker says what the model was, so a gateway
    that does not serve the model (unloaded, or never loaded there) still polls it as a
    list of responses."""
    blind_root = tmp_path / "blind"
    blind_root.mkdir()
    blind = decoupled_settings.model_copy(update={"repository": blind_root})
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [0, DATA]}]}
    async with (
        served(decoupled_settings, redis_client) as (gw, _),
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        submitted = await http.post(f"/v2/models/{MODEL}/jobs", json=body)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]

        async def done() -> bool:
            polled = (await http.get(f"/v2/jobs/{job_id}")).json()
            return bool(polled["status"] != "pending")

        await wait_for(done, 30, "the job to be answered")
    async with (
        gateway_fronts(blind) as other,
        httpx.AsyncClient(base_url=other.http_url, trust_env=False, timeout=60) as http,
        PlazaClient(blind) as client,
    ):
        assert (await http.get(f"/v2/models/{MODEL}")).status_code == 404  # not served here
        polled = (await http.get(f"/v2/jobs/{job_id}")).json()
        status = await client.poll(job_id)
    assert polled["status"] == "done"
    assert [r["outputs"][0]["data"] for r in polled["responses"]] == [[0]]
    assert status.decoupled is True and [r.index for r in status.responses] == [0]


async def test_the_sdk_streams_a_decoupled_models_responses(
    decoupled_settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    async with (
        served(decoupled_settings, redis_client) as (_, responder),
        PlazaClient(decoupled_settings) as client,
    ):
        x = {"IN": np.array([3, EMPTY], np.int32)}
        got = [(r.index, r.final, r.output("OUT").to_numpy().tolist()) async for r in
               client.infer_stream(MODEL, x, timeout_s=30)]  # fmt: skip
        with_data = [
            r.index async for r in client.infer_stream(MODEL, {"IN": np.array([1, DATA], np.int32)})
        ]
        with pytest.raises(Unsupported, match="decoupled"):
            await client.infer(MODEL, x)

        def sync_stream() -> list[int]:  # on a thread: the responder runs on this loop
            with SyncPlazaClient(decoupled_settings) as sync:
                return [r.index for r in sync.infer_stream(MODEL, x, timeout_s=30)]

        by_sync_client = await asyncio.to_thread(sync_stream)
        job = await client.submit(MODEL, {"IN": np.array([2, DATA], np.int32)})
        await client.result(job)  # polls until done
        status = await client.poll(job)
        published = len(responder.requests)
    assert got == [(0, False, [0]), (1, False, [1]), (2, False, [2])]  # the empty final: left out
    assert with_data == [0, 1] and by_sync_client == [0, 1, 2]
    assert [(r.index, r.final) for r in status.responses] == [(0, False), (1, False), (2, True)]
    assert status.result is not None and status.result.index == 2 and status.missing == 0
    assert published == 4  # infer was refused before publishing


async def test_generate_stream_sends_each_event_as_it_comes_and_a_client_gone_cancels(
    decoupled_settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    names = decoupled_settings.names
    async with (
        served(decoupled_settings, redis_client) as (gw, responder),
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        responder.gate.clear()  # each request's responses after its first wait for the gate
        path = f"/v2/models/{MODEL}/generate_stream"
        async with http.stream("POST", path, json={"IN": [3, DATA]}) as response:
            assert response.headers["transfer-encoding"] == "chunked"
            lines = response.aiter_lines()
            first = await anext(lines)  # came alone: the responder waits for the gate
            responder.gate.set()
            rest = [line async for line in lines if line]
        responder.gate.clear()
        async with http.stream("POST", path, json={"IN": [3, DATA]}) as left:
            assert (await anext(left.aiter_lines())).startswith("data: ")
        # the client left before the final response: the request is answered 'cancelled'
        req_id = responder.requests[-1].id

        async def cancelled() -> bool:
            return await redis_client.get(names.result_key(req_id)) is not None

        await wait_for(cancelled, 10, "the cancelled answer")
        raw = await redis_client.get(names.result_key(req_id))
        assert isinstance(raw, bytes)
        stored = decode_result(raw)
        responder.gate.set()
    assert orjson.loads(first.removeprefix("data: "))["OUT"] == 0
    assert [orjson.loads(line.removeprefix("data: "))["OUT"] for line in rest] == [1, 2, 3]
    assert stored.error is not None and stored.error.code == "cancelled"
