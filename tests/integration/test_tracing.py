"""Triton's trace extension through the whole stack: tritonclient turns tracing on over
HTTP, requests over both fronts reach a worker of identity through Kafka, and the gateway's
trace file holds each request's stages, the worker's between the gateway's own, in order;
a model's own setting (over gRPC) turns it off for that model alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker

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
