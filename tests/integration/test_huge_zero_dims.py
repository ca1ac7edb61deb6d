"""An empty input with a dimension numpy cannot hold is a bad input on every entry.

Shape [2**63-1, 0] on a model whose dims are [-1, -1] holds no element, so its (empty)
data matched it: it passed validation and failed in the worker, where numpy refused to
make the array, as the model's error (HTTP 500, gRPC INTERNAL, the SDK's ``model_error``,
a logged traceback, the batch split and retried). The gateway and the worker now refuse it
as ``invalid_input``: HTTP 400, gRPC INVALID_ARGUMENT, and, for the SDK (which publishes
without validating), the worker's answer.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from tests.support import gateway_fronts, model_variant, running_worker, wait_for

CONFIG = """
name: "ident0"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }]
"""
BIG = 2**63 - 1


def _json(shape: list[int], data: list[float]) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": data}]}


async def _grpc_infer(address: str, shape: list[int]) -> grpc.aio.AioRpcError:
    request = pb.ModelInferRequest(model_name="ident0")
    item = request.inputs.add()
    item.name, item.datatype = "INPUT0", "FP32"
    item.shape.extend(shape)
    request.raw_input_contents.append(b"")
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            await stub.ModelInfer(request)
        except grpc.aio.AioRpcError as exc:
            return exc
    raise AssertionError("the gRPC front answered a shape numpy cannot hold")


async def test_http_grpc_and_the_sdk_answer_invalid_input(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": model_variant(tmp_path, "ident0", CONFIG)})
    async with (
        running_worker(settings, "ident0"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
        PlazaClient(settings) as sdk,
    ):

        async def ready() -> bool:
            return (await http.get("/v2/models/ident0/ready")).status_code == 200

        await wait_for(ready, 60, "ident0 ready")
        sane = await http.post("/v2/models/ident0/infer", json=_json([1, 2], [1.0, 2.0]))
        huge = await http.post("/v2/models/ident0/infer", json=_json([BIG, 0], []))
        refused = await _grpc_infer(gw.grpc_address, [BIG, 0])
        kafka = await sdk.infer(
            "ident0", [Tensor("INPUT0", "FP32", (BIG, 0), b"")], raise_on_error=False
        )
        after = await sdk.infer("ident0", {"INPUT0": np.ones((1, 2), np.float32)})

    assert sane.status_code == 200, sane.text
    assert huge.status_code == 400, huge.text
    assert huge.json()["code"] == "invalid_input"
    assert "'INPUT0'" in huge.json()["error"] and f"[{BIG}, 0]" in huge.json()["error"]
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
    assert kafka.error is not None and kafka.error.code == "invalid_input", kafka.error
    assert f"[{BIG}, 0]" in kafka.error.message
    assert after.status == "ok"  # the worker still serves
