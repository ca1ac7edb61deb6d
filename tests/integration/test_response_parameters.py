"""A Python model's response parameters (``InferenceResponse(parameters={...})``) reach every
client, through real workers on real Kafka and Redis.

``annotated`` (tests/python_models.py) answers with {"a": 1, "b": "x", "c": True}:
tritonclient's HTTP client finds them as the response's top-level ``parameters`` (JSON and
binary bodies), its gRPC client in ``ModelInferResponse.parameters``; so do a polled job,
``generate``, the SDK and a pipeline's result stream. A response whose parameters pb_utils
refuses fails its own request, and the worker serves on. ``annotated_stream`` (decoupled)
gives each response parameters of its own, which the gRPC stream passes on beside
``triton_final_response``.
"""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from plaza.client import PlazaClient, make_request
from plaza.settings import PlazaSettings
from tests.integration.test_gateway_http import poll_until
from tests.python_models import write_repository
from tests.support import gateway_fronts, make_settings, running_worker

pytestmark = pytest.mark.timeout(180)

PARAMS = {"a": 1, "b": "x", "c": True}


@pytest.fixture
def settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> PlazaSettings:
    root = write_repository(tmp_path / "repository", "annotated", "annotated_stream")
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


def _plain(params: Any) -> dict[str, Any]:
    """A gRPC ``map<string, InferParameter>`` as plain values, each kind checked."""
    kinds = {bool: "bool_param", int: "int64_param", str: "string_param"}
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, kind)
        assert kind == kinds[type(out[key])], (key, kind)
    return out


def _http_infer(url: str, value: int, binary: bool) -> dict[str, Any]:
    """tritonclient.http's answer to annotated: its response (parameters and all)."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    try:
        item = httpclient.InferInput("INPUT0", [1, 1], "INT32")
        item.set_data_from_numpy(np.array([[value]], np.int32), binary_data=binary)
        wanted = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        result = client.infer("annotated", [item], outputs=wanted)
        assert result.as_numpy("OUTPUT0").tolist() == [[value]]
        response: dict[str, Any] = result.get_response()
        return response
    finally:
        client.close()


def _grpc_infer(address: str, value: int) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(address)
    try:
        item = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
        item.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer("annotated", [item])
        assert result.as_numpy("OUTPUT0").tolist() == [[value]]
        return _plain(result.get_response().parameters)
    finally:
        client.close()


async def test_http_grpc_jobs_generate_and_the_sdk_get_the_response_parameters(
    settings: PlazaSettings,
) -> None:
    async with running_worker(settings, "annotated"), gateway_fronts(settings) as gw:
        over_json = await asyncio.to_thread(_http_infer, gw.http_url, 3, False)
        over_binary = await asyncio.to_thread(_http_infer, gw.http_url, 4, True)
        over_grpc = await asyncio.to_thread(_grpc_infer, gw.grpc_address, 5)
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1],
                                "data": [6]}]}  # fmt: skip
            submitted = await http.post("/v2/models/annotated/jobs", json=body)
            assert submitted.status_code == 202, submitted.text
            polled = await poll_until(http, submitted.json()["job_id"], "done")
            generated = await http.post("/v2/models/annotated/generate", json={"INPUT0": 7})
        async with PlazaClient(settings) as client:
            sdk = await client.infer("annotated", {"INPUT0": np.array([[8]], np.int32)})
            stream = client.results_stream("annotated")
            ids = await client.publish_many(
                make_request("annotated", {"INPUT0": np.array([[v]], np.int32)},
                             reply_stream=stream)
                for v in (9, 10)
            )  # fmt: skip
            piped: dict[str, dict[str, Any]] = {}
            async for _, results in client.consume(stream, "g", "c1", block_ms=500):
                piped.update((r.id, dict(r.parameters)) for r in results)
                if len(piped) == len(ids):
                    break
    assert over_json["parameters"] == PARAMS and over_binary["parameters"] == PARAMS
    assert over_grpc == PARAMS
    assert polled["parameters"] == PARAMS and polled["outputs"][0]["data"] == [6]
    assert generated.status_code == 200, generated.text
    assert generated.json() == {"model_name": "annotated", "model_version": "1",
                                "OUTPUT0": 7, **PARAMS}  # fmt: skip
    assert sdk.parameters == PARAMS and sdk.as_numpy()["OUTPUT0"].tolist() == [[8]]
    assert piped == {rid: PARAMS for rid in ids}


async def test_parameters_the_model_may_not_send_fail_its_request_not_the_worker(
    settings: PlazaSettings,
) -> None:
    """-1 makes annotated attach a float: InferenceResponse raises, its execute with it; the
    request sharing its batch is answered (the runner splits the batch), so is the next."""
    async with running_worker(settings, "annotated"), PlazaClient(settings) as client:

        def ask(value: int) -> Any:
            x = {"INPUT0": np.array([[value]], np.int32)}
            return client.infer("annotated", x, raise_on_error=False, timeout_s=60)

        bad, mate = await asyncio.gather(ask(-1), ask(2))
        after = await ask(3)
    assert bad.error is not None and bad.error.code == "model_error"
    assert "parameter 'bad'" in bad.error.message and "bool/int/str" in bad.error.message
    assert mate.error is None and mate.parameters == PARAMS
    assert after.error is None and after.parameters == PARAMS


def _grpc_stream(address: str, values: list[int], **options: Any) -> list[dict[str, Any]]:
    """tritonclient's gRPC stream to annotated_stream: each response's parameters, until
    the last (marked final, or the one response expected when none is marked)."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        item = grpcclient.InferInput("IN", [1, len(values)], "INT32")
        item.set_data_from_numpy(np.array([values], np.int32))
        client.async_stream_infer("annotated_stream", [item], **options)
        seen: list[dict[str, Any]] = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            seen.append(_plain(result.get_response().parameters))
            if seen[-1].get("triton_final_response") or (
                "enable_empty_final_response" not in options and len(seen) == len(values)
            ):
                return seen
    finally:
        client.stop_stream()
        client.close()


async def test_each_streamed_response_carries_its_own_parameters(
    settings: PlazaSettings,
) -> None:
    async with running_worker(settings, "annotated_stream"), gateway_fronts(settings) as gw:
        address = gw.grpc_address
        plain = await asyncio.to_thread(_grpc_stream, address, [3, 4, 5])
        marked = await asyncio.to_thread(
            _grpc_stream, address, [6, 7], enable_empty_final_response=True
        )
        last_final = await asyncio.to_thread(
            _grpc_stream, address, [8], enable_empty_final_response=True,
            parameters={"last_is_final": True},
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http:
            answer = await http.post(
                "/v2/models/annotated_stream/generate_stream", json={"IN": [1, 2]}
            )
        async with PlazaClient(settings) as client:
            x = {"IN": np.array([[11, 12]], np.int32)}
            sdk = [dict(r.parameters) async for r in client.infer_stream("annotated_stream", x)]
    assert plain == [  # marked without the opt-in too, as Triton's stream marks them
        {"index": 0, "word": "w3", "even": True, "triton_final_response": False},
        {"index": 1, "word": "w4", "even": False, "triton_final_response": False},
        {"index": 2, "word": "w5", "even": True, "triton_final_response": False},
    ]
    assert marked == [  # the gateway's marker beside the model's own, not in their place
        {"index": 0, "word": "w6", "even": True, "triton_final_response": False},
        {"index": 1, "word": "w7", "even": False, "triton_final_response": False},
        {"triton_final_response": True},  # the empty final response: the marker alone
    ]
    assert last_final == [{"index": 0, "word": "w8", "even": True, "triton_final_response": True}]
    assert answer.status_code == 200, answer.text
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in answer.content.split(b"\n\n")[:-1]]
    assert [(e["OUT"], e["index"], e["word"]) for e in events] == [(1, 0, "w1"), (2, 1, "w2")]
    assert sdk == [{"index": 0, "word": "w11", "even": True},
                   {"index": 1, "word": "w12", "even": False}]  # fmt: skip
