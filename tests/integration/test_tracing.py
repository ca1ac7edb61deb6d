"""Triton's trace extension through the whole stack: tritonclient turns tracing on over
HTTP, requests over both fronts reach a worker of identity through Kafka, and the gateway's
trace file holds each request's stages, the worker's between the gateway's own, in order;
a model's own setting (over gRPC) turns it off for that model alone."""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path

import numpy as np
import orjson
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

from plaza.settings import PlazaSettings
from tests.python_models import write_repository
from tests.support import gateway_fronts, make_settings, running_worker, wait_for

STAGES = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


def _input(module: object) -> list[object]:
    item = module.InferInput("INPUT0", [1, 4], "FP32")  # type: ignore[attr-defined]
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return [item]


async def test_traced_requests_land_in_the_trace_file(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    gateway = settings.gateway.model_copy(update={"trace_dir": tmp_path})
    settings = settings.model_copy(update={"gateway": gateway})
    async with running_worker(settings, "identity"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
        try:
            on = {
                "trace_level": ["TIMESTAMPS"],
                "trace_rate": "1",
                "trace_file": "plaza.jsonl",
                "log_frequency": "1",
            }
            answered = await http.update_trace_settings(settings=on)
            await http.infer("identity", _input(http_aio))
            await http.infer("identity", _input(http_aio))
            await grpc.infer("identity", _input(grpc_aio))
            await grpc.update_trace_settings(model_name="identity", settings={"trace_level": "OFF"})
            await http.infer("identity", _input(http_aio))  # not traced
            model_level = await http.get_trace_settings(model_name="identity")
            global_level = await grpc.get_trace_settings(as_json=True)
            assert "trace" in (await http.get_server_metadata())["extensions"]
        finally:
            await http.close()
            await grpc.close()
    assert answered["trace_rate"] == "1" and answered["trace_level"] == ["TIMESTAMPS"]
    assert model_level["trace_level"] == ["OFF"] and model_level["trace_file"] == "plaza.jsonl"
    assert global_level["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
    traces = [orjson.loads(line) for line in (tmp_path / "plaza.jsonl").read_bytes().splitlines()]
    assert len(traces) == 3
    for trace in traces:
        assert trace["model_name"] == "identity" and trace["model_version"] == "1"
        # the stages sorted by their moments: in Triton's order, the worker's between the
        # gateway's own
        assert [s["name"] for s in trace["timestamps"]] == STAGES


def _stream_repeat(address: str, ids: list[str]) -> int:
    """tritonclient's gRPC stream against ``repeat``: one request per id, each answered
    with three responses and an empty final one; how many responses came."""
    got: queue.Queue[tuple[object, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    count = 0
    try:
        for rid in ids:
            item = grpcclient.InferInput("IN", [1, 3], "INT32")
            item.set_data_from_numpy(np.array([[4, 5, 6]], np.int32))
            client.async_stream_infer("repeat", [item], request_id=rid)
            for _ in range(3):  # the empty final one is not sent without asking
                _, error = got.get(timeout=60)
                assert error is None, error
                count += 1
    finally:
        client.stop_stream()
        client.close()
    return count


async def test_a_streamed_request_is_traced_to_its_final_response(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    """A decoupled model's request over the gRPC stream: its trace holds the worker's
    stages, its first response's moment (INFER_RESPONSE_COMPLETE) and its end."""
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=write_repository(tmp_path / "repository", "repeat"),
        gateway={"trace_dir": tmp_path / "traces"},
    )
    async with running_worker(settings, "repeat"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        try:
            await http.update_trace_settings(
                settings={
                    "trace_level": ["TIMESTAMPS"],
                    "trace_rate": "1",
                    "trace_file": "stream.jsonl",
                    "log_frequency": "1",
                }
            )
        finally:
            await http.close()
        ids = ["traced-1", "traced-2"]
        assert await asyncio.to_thread(_stream_repeat, gw.grpc_address, ids) == 6
        trace_file = tmp_path / "traces" / "stream.jsonl"
        await wait_for(lambda: trace_file.exists() and trace_file.read_bytes().count(b"\n") == 2)
    traces = [orjson.loads(line) for line in trace_file.read_bytes().splitlines()]
    assert len({t["request_id"] for t in traces}) == 2  # one trace per request
    for trace in traces:
        assert trace["model_name"] == "repeat" and trace["model_version"] == "1"
        names = [s["name"] for s in trace["timestamps"]]
        assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END"
        assert names.index("QUEUE_START") < names.index("COMPUTE_START")
        # the first response passed the gateway after the worker started on the request
        assert names.index("COMPUTE_START") < names.index("INFER_RESPONSE_COMPLETE")
        assert set(names) == {*STAGES, "INFER_RESPONSE_COMPLETE"}


async def test_traces_are_written_once_trace_count_is_used_up(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """As Triton: with log_frequency 0, the traces are written when trace_count reaches 0,
    while the gateway still runs (not held until it stops)."""
    gateway = settings.gateway.model_copy(update={"trace_dir": tmp_path})
    settings = settings.model_copy(update={"gateway": gateway})
    trace_file = tmp_path / "counted.jsonl"
    async with running_worker(settings, "identity"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        try:
            on = {
                "trace_level": ["TIMESTAMPS"],
                "trace_rate": "1",
                "trace_count": "3",
                "trace_file": trace_file.name,
            }
            await http.update_trace_settings(settings=on)
            for _ in range(4):  # the fourth is not traced: the count is used up
                await http.infer("identity", _input(http_aio))
            left = await http.get_trace_settings()
        finally:
            await http.close()
        await wait_for(
            lambda: trace_file.exists() and trace_file.read_bytes().count(b"\n") == 3,
            what="3 traces in the file while the gateway runs",
        )
    assert (left["trace_count"], left["log_frequency"]) == ("0", "0")
    assert trace_file.read_bytes().count(b"\n") == 3
