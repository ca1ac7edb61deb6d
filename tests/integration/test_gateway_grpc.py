"""The gRPC front end to end, driven by tritonclient.grpc (sync and streaming) and
tritonclient.grpc.aio: grpc.aio -> the gateway service -> Kafka -> a real worker -> Redis.

Each test serves both fronts of one gateway (``plaza.gateway.main.serving``) with its own
prefixes, so an answer over gRPC can be compared with the same request over HTTP.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from plaza.gateway import grpc_health
from plaza.gateway.registry import MODEL_CONTROL_DISABLED
from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker, wait_for


def add_sub_inputs(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> list[Any]:
    inputs = [aioclient.InferInput("INPUT0", list(a.shape), "INT32")]
    inputs.append(aioclient.InferInput("INPUT1", list(b.shape), "INT32"))
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def identity_input(x: np.ndarray[Any, Any]) -> list[Any]:
    item = grpcclient.InferInput("INPUT0", list(x.shape), np_to_triton_dtype(x.dtype))
    item.set_data_from_numpy(x)
    return [item]


async def test_aio_infer_matches_http_and_metadata_matches(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("add_sub")
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    async with running_worker(settings, "add_sub"), gateway_fronts(settings) as gw:
        client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("add_sub")
            result = await client.infer("add_sub", add_sub_inputs(a, b), request_id="mine")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            response = result.get_response()
            assert (response.id, response.model_name, response.model_version) == (
                "mine",
                "add_sub",
                "1",
            )

            async def counted() -> bool:
                stats = await client.get_inference_statistics("add_sub", as_json=True)
                return int(stats["model_stats"][0].get("inference_count", 0)) >= 2

            await wait_for(counted, 30, "the statistics to count the request")
            meta = await client.get_model_metadata("add_sub", as_json=True)
            config = await client.get_model_config("add_sub", as_json=True)
            server = await client.get_server_metadata(as_json=True)
        finally:
            await client.close()
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False) as http:
            http_meta = (await http.get("/v2/models/add_sub")).json()
            http_config = (await http.get("/v2/models/add_sub/config")).json()
            body = {
                "inputs": [
                    {"name": n, "datatype": "INT32", "shape": [2, 16], "data": v.ravel().tolist()}
                    for n, v in (("INPUT0", a), ("INPUT1", b))
                ]
            }
            http_out = (await http.post("/v2/models/add_sub/infer", json=body)).json()["outputs"]
    assert {o["name"]: o["data"] for o in http_out} == {
        "OUTPUT0": result.as_numpy("OUTPUT0").ravel().tolist(),
        "OUTPUT1": result.as_numpy("OUTPUT1").ravel().tolist(),
    }
    assert meta["name"] == http_meta["name"] and meta["versions"] == http_meta["versions"]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [
        (t["name"], t["datatype"], t["shape"]) for t in http_meta["inputs"]
    ]
    assert config["config"]["name"] == http_config["name"] == "add_sub"
    assert int(config["config"]["max_batch_size"]) == http_config["max_batch_size"]
    assert server["name"] == "plaza" and "binary_tensor_data" in server["extensions"]


async def test_typed_contents_are_accepted_like_raw_ones(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("add_sub")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    request = pb.ModelInferRequest(model_name="add_sub", id="typed")
    for name in ("INPUT0", "INPUT1"):
        item = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        item.contents.int_contents.extend(a.ravel().tolist())
    async with (
        running_worker(settings, "add_sub"),
        gateway_fronts(settings) as gw,
        grpc.aio.insecure_channel(gw.grpc_address) as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        response = await stub.ModelInfer(request)
        mixed = pb.ModelInferRequest()
        mixed.CopyFrom(request)
        mixed.raw_input_contents.extend([a.tobytes(), a.tobytes()])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ModelInfer(mixed)
    outputs = {o.name: i for i, o in enumerate(response.outputs)}
    total = np.frombuffer(response.raw_output_contents[outputs["OUTPUT0"]], np.int32)
    np.testing.assert_array_equal(total, 2 * a.ravel())
    assert response.id == "typed"
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot both be given" in (refused.value.details() or "")


async def test_sync_client_and_compressed_stream_with_many_requests_in_flight(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity")
    xs = {f"r{i}": np.full((1, 50), i, dtype=np.float32) for i in range(40)}
    async with running_worker(settings, "identity"), gateway_fronts(settings) as gw:

        def drive() -> tuple[np.ndarray[Any, Any], dict[str, Any]]:
            client = grpcclient.InferenceServerClient(gw.grpc_address)
            answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
            try:  # compressed both ways a client of Triton's can ask
                x = identity_input(xs["r1"])
                one = client.infer("identity", x, compression_algorithm="gzip").as_numpy("OUTPUT0")
                client.start_stream(
                    callback=lambda result, error: answers.put((result, error)),
                    compression_algorithm="deflate",
                )
                for rid, x in xs.items():  # all sent before any answer is read
                    client.async_stream_infer("identity", identity_input(x), request_id=rid)
                got = {}
                for _ in xs:
                    result, error = answers.get(timeout=60)
                    assert error is None, error
                    got[result.get_response().id] = result.as_numpy("OUTPUT0")
                client.stop_stream()
                return one, got
            finally:
                client.close()

        one, got = await asyncio.to_thread(drive)
    np.testing.assert_array_equal(one, xs["r1"])
    assert set(got) == set(xs)
    for rid, x in xs.items():
        np.testing.assert_array_equal(got[rid], x)


async def test_errors_carry_grpc_status_codes_and_stream_errors_are_per_request(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity")
    good = np.zeros((1, 50), dtype=np.float32)
    bad = np.zeros((1, 7), dtype=np.int32)  # identity wants FP32
    async with running_worker(settings, "identity"), gateway_fronts(settings) as gw:
        client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            with pytest.raises(InferenceServerException) as unknown:
                await client.infer("nope", identity_input(good))
            with pytest.raises(InferenceServerException) as invalid:
                await client.infer("identity", identity_input(bad))
            with pytest.raises(InferenceServerException) as load:
                await client.load_model("identity")
            index = await client.get_model_repository_index(as_json=True)
            with pytest.raises(InferenceServerException) as shm:
                await client.get_cuda_shared_memory_status()  # no GPU memory is shared

            async def requests() -> AsyncIterator[dict[str, Any]]:
                yield {"model_name": "identity", "inputs": identity_input(bad), "request_id": "b"}
                yield {"model_name": "identity", "inputs": identity_input(good), "request_id": "g"}

            streamed: dict[str, Any] = {}
            async for result, error in client.stream_infer(requests()):
                if error is not None:
                    streamed[error.message()] = error
                else:
                    streamed[result.get_response().id] = result
                if len(streamed) == 2:
                    break
        finally:
            await client.close()
    assert unknown.value.status() == "StatusCode.NOT_FOUND" and "nope" in unknown.value.message()
    assert invalid.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "datatype" in invalid.value.message()
    assert load.value.status() == "StatusCode.UNAVAILABLE"
    assert load.value.message() == MODEL_CONTROL_DISABLED
    assert [(m["name"], m["state"]) for m in index["models"]] == [("identity", "READY")]
    assert shm.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "g" in streamed
    (message,) = [k for k in streamed if k != "g"]
    assert "datatype" in message


async def test_api_key_is_required_as_metadata_but_not_for_health(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", api_key="s3cret")
    x = np.ones((1, 50), dtype=np.float32)
    async with running_worker(settings, "identity"), gateway_fronts(settings) as gw:
        client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            assert await client.is_server_live()
            with pytest.raises(InferenceServerException) as refused:
                await client.infer("identity", identity_input(x))
            with pytest.raises(InferenceServerException) as wrong:
                await client.get_model_metadata("identity", headers={"authorization": "Bearer x"})
            auth = {"authorization": "Bearer s3cret"}
            result = await client.infer("identity", identity_input(x), headers=auth)
        finally:
            await client.close()
        async with grpc.aio.insecure_channel(gw.grpc_address) as channel:
            request = grpc_health.HealthCheckRequest(service="")  # no key, as a probe calls
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=type(request).SerializeToString,
                response_deserializer=grpc_health.HealthCheckResponse.FromString,
            )
            health = await check(request)
    assert refused.value.status() == wrong.value.status() == "StatusCode.UNAUTHENTICATED"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert health.status == grpc_health.SERVING


async def test_a_cancelled_call_stops_waiting_and_the_worker_skips_it(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    # No worker at first: nothing answers, and the gateway would wait ten minutes on its own.
    settings = settings_for("identity", sync_timeout_s=600)
    x = np.ones((1, 50), dtype=np.float32)
    async with gateway_fronts(settings) as gw:
        mux = await gw.service.producer.replies()
        client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            call = asyncio.create_task(
                client.infer("identity", identity_input(x), client_timeout=3.0)
            )
            await wait_for(lambda: mux.waiting == 1, 30, "the gateway to wait for the call")
            (cancelled_id,) = mux._waiters  # the correlation id the gateway gave the call
            with pytest.raises(InferenceServerException) as timed_out:
                await call
            await wait_for(lambda: mux.waiting == 0, 30, "the gateway to stop waiting")
            # The cancelled answer is stored before any worker ran the request ...
            producer = gw.service.producer

            async def stored() -> bool:
                return (await producer.poll(cancelled_id)).state == "done"

            await wait_for(stored, 30, "the cancelled answer")
            status = await producer.poll(cancelled_id)
            assert status.result is not None and status.result.error is not None
            assert status.result.error.code == "cancelled"
            # ... so the worker that comes up skips it, and serves the next call.
            async with running_worker(settings, "identity") as worker:
                answer = await client.infer("identity", identity_input(x * 2))
                await wait_for(lambda: worker.metrics.records["skipped"] == 1, 30, "the skip")
        finally:
            await client.close()
    assert timed_out.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), x * 2)
    assert worker.metrics.records["written"] == 1  # the cancelled one never ran
    assert worker.metrics.executions() == 1
