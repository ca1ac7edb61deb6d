"""The private lane over KServe v2 gRPC: the baseline server's lane behind grpc.aio.

Served with tritonclient's service definitions, as Plaza's gRPC front is: the health,
metadata, config and statistics calls perf_analyzer makes, and ModelInfer with raw tensor
contents (what perf_analyzer and tritonclient send), one ONNX Runtime call per request, or
the lane's canned answer. Nothing else: any other call is UNIMPLEMENTED.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.datatypes import from_numpy_dtype, to_numpy_dtype
from plaza.loadgen.baseline_server import Lane


class LaneServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """GRPCInferenceService on one ``Lane``."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self._metadata = json_format.ParseDict(lane.metadata(), pb.ModelMetadataResponse())
        config = json_format.ParseDict(lane.config, mc.ModelConfig(), ignore_unknown_fields=True)
        self._config = pb.ModelConfigResponse(config=config)
        self._canned = _response(lane, lane.zeros_answer) if lane.canned else None

    async def ServerLive(self, request: pb.ServerLiveRequest, context: object) -> object:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: object) -> object:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: object) -> object:
        return pb.ModelReadyResponse(ready=request.name == self.lane.model)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: object) -> object:
        return pb.ServerMetadataResponse(name="baseline", version="0")

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: object) -> object:
        return self._metadata

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: object) -> object:
        return self._config

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: object) -> object:
        return json_format.ParseDict(self.lane.statistics(), pb.ModelStatisticsResponse())

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> object:
        started = time.perf_counter_ns()
        if self._canned is not None:
            response = self._canned
        else:
            if len(request.raw_input_contents) != len(request.inputs):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "the baseline reads raw_input_contents only"
                )
            feeds = {
                t.name: np.frombuffer(raw, dtype=to_numpy_dtype(t.datatype)).reshape(t.shape)
                for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
            }
            response = _response(self.lane, self.lane.run(feeds))
        self.lane.answered(started)
        return response


def _response(lane: Lane, outputs: list[np.ndarray]) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=lane.model, model_version=lane.version)
    for name, array in zip(lane.output_names, outputs, strict=True):
        arr = np.ascontiguousarray(array)
        response.outputs.add(name=name, datatype=from_numpy_dtype(arr.dtype), shape=arr.shape)
        response.raw_output_contents.append(arr.tobytes())
    return response


async def start_grpc(lane: Lane, host: str, port: int) -> grpc.aio.Server:
    """A started grpc.aio server of ``lane`` on ``host:port``."""
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(LaneServicer(lane), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"the baseline's gRPC front cannot listen on {host}:{port}")
    await server.start()
    return server
