"""The gRPC front's answers (``gateway.grpc_codec``): a result as the ``ModelInferResponse``
that tritonclient reads, its response parameters included."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import InferResult as TritonResult
from tritonclient.grpc import service_pb2 as pb

from plaza.contract import InferResult
from plaza.gateway import grpc_codec
from plaza.tensors import Tensor

Y = (Tensor.from_numpy("Y", np.array([[3]], np.int32)),)


def _plain(params: Any) -> dict[str, tuple[str, Any]]:
    """A ``map<string, InferParameter>`` as name -> (kind, value)."""
    out: dict[str, tuple[str, Any]] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        out[key] = (kind, getattr(param, kind))
    return out


def test_a_responses_parameters_are_its_infer_parameters_each_of_its_kind() -> None:
    params = {"a": 1, "b": "x", "c": True, "big": 2**63 - 1, "f": 0.5}
    result = InferResult("corr", "m", "1", Y, parameters=params)
    msg = grpc_codec.encode_infer_response(result, "client")
    read = TritonResult(pb.ModelInferResponse.FromString(msg.SerializeToString()))
    assert _plain(read.get_response().parameters) == {
        "a": ("int64_param", 1),
        "b": ("string_param", "x"),
        "c": ("bool_param", True),
        "big": ("int64_param", 2**63 - 1),
        "f": ("double_param", 0.5),
    }
    assert read.as_numpy("Y").tolist() == [[3]] and read.get_response().id == "client"
    plain = grpc_codec.encode_infer_response(InferResult("corr", "m", "1", Y), "client")
    assert not plain.parameters and plain.ByteSize() < msg.ByteSize()


def test_the_streams_final_marker_joins_the_models_parameters() -> None:
    """``triton_final_response`` (asked for with ``triton_enable_empty_final_response``) is
    added beside the model's own parameters, never in their place."""
    result = InferResult("corr", "m", "1", Y, parameters={"a": 1, "b": "x"}, final=False)
    msg = grpc_codec.mark_final(grpc_codec.encode_infer_response(result, "r"), result.final)
    assert _plain(msg.parameters) == {
        "a": ("int64_param", 1),
        "b": ("string_param", "x"),
        "triton_final_response": ("bool_param", False),
    }
    empty = InferResult("corr", "m", "1", index=2, empty=True)
    closing = grpc_codec.mark_final(grpc_codec.encode_infer_response(empty, "r"), True)
    assert _plain(closing.parameters) == {"triton_final_response": ("bool_param", True)}
