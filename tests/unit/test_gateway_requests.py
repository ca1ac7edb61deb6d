"""Triton's request parameters, taken the same way by both fronts (gateway.requests)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from plaza.errors import InvalidInput
from plaza.gateway import grpc_codec
from plaza.gateway.requests import FrontRequest
from plaza.gateway.service import GatewayService
from plaza.tensors import Tensor
from tests.support import make_settings

X = (Tensor.from_numpy("X", np.zeros((1, 2), np.float32)),)


def test_timeout_and_priority_are_taken_out_and_the_rest_travels() -> None:
    front = FrontRequest.from_parameters(X, ("Y",), {"timeout": 5_000, "priority": 3, "k": 1})
    assert (front.timeout_us, front.priority, front.parameters) == (5_000, 3, {"k": 1})
    req = front.to_request("m", "", "c1")
    assert req.deadline_ms is not None and req.deadline_ms - req.created_ms == 5
    assert (req.priority, req.outputs, req.parameters) == (3, ("Y",), {"k": 1})


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
def test_a_timeout_or_priority_that_is_not_a_non_negative_int_is_refused(value: object) -> None:
    for key in ("timeout", "priority"):
        with pytest.raises(InvalidInput, match=key):
            FrontRequest.from_parameters(X, (), {key: value})  # type: ignore[dict-item]


def test_grpc_parameters_mean_what_http_parameters_mean() -> None:
    msg = pb.ModelInferRequest(model_name="m", id="label")
    item = msg.inputs.add(name="X", datatype="FP32", shape=[1, 2])
    item.contents.fp32_contents.extend([1.0, 2.0])
    msg.parameters["timeout"].int64_param = 5_000
    msg.parameters["priority"].uint64_param = 2
    msg.parameters["k"].string_param = "v"
    front = grpc_codec.decode_infer_request(msg)
    assert (front.timeout_us, front.priority, front.parameters) == (5_000, 2, {"k": "v"})
    np.testing.assert_array_equal(front.inputs[0].to_numpy(), [[1.0, 2.0]])


def _shared_memory(m: pb.ModelInferRequest) -> None:
    m.parameters["shared_memory_region"].string_param = "r0"


def _wrong_contents(m: pb.ModelInferRequest) -> None:
    m.inputs[0].contents.int_contents.append(1)


def _raw_and_typed(m: pb.ModelInferRequest) -> None:
    m.raw_input_contents.append(b"\0" * 8)


def _no_contents(m: pb.ModelInferRequest) -> None:
    m.inputs.add(name="Z", datatype="FP32", shape=[1])


def _unknown_datatype(m: pb.ModelInferRequest) -> None:
    m.inputs[0].datatype = "FP99"


def _negative_dim(m: pb.ModelInferRequest) -> None:
    m.inputs[0].shape.append(-3)


@pytest.mark.parametrize(
    ("spoil", "words"),
    [
        (_shared_memory, "not supported"),
        (_wrong_contents, "expected fp32_contents"),
        (_raw_and_typed, "cannot both be given"),
        (_no_contents, "no contents"),
        (_unknown_datatype, "unknown datatype"),
        (_negative_dim, "negative dimension"),
    ],
)
def test_malformed_grpc_requests_are_invalid_input(
    spoil: Callable[[pb.ModelInferRequest], None], words: str
) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    item = msg.inputs.add(name="X", datatype="FP32", shape=[1, 2])
    item.contents.fp32_contents.extend([1.0, 2.0])
    spoil(msg)
    with pytest.raises(InvalidInput, match=words):
        grpc_codec.decode_infer_request(msg)


def test_typed_integers_out_of_range_are_refused() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    item = msg.inputs.add(name="X", datatype="INT8", shape=[1])
    item.contents.int_contents.append(300)
    with pytest.raises(InvalidInput, match="out of range for INT8"):
        grpc_codec.decode_infer_request(msg)


def test_a_zero_timeout_is_no_timeout_as_in_triton() -> None:
    """Triton's request timeout 0 means none: no deadline, and the sync wait is the
    configured one (it was a deadline of now and a wait of 0: a 503 at once)."""
    front = FrontRequest.from_parameters(X, (), {"timeout": 0})
    assert front.timeout_us is None
    assert front.to_request("m", "", "c1").deadline_ms is None
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    msg.parameters["timeout"].int64_param = 0
    assert grpc_codec.decode_infer_request(msg).timeout_us is None
    service = GatewayService(make_settings("127.0.0.1:1", "redis://127.0.0.1:1/0", "t"))
    configured = service.settings.gateway.sync_timeout_s
    assert service.sync_timeout(0) == service.sync_timeout(None) == configured
    assert service.sync_timeout(2_000_000) == min(configured, 2.0)


@pytest.mark.parametrize(("timeout_us", "ms"), [(1, 1), (999, 1), (1_000, 1), (1_001, 2)])
def test_a_sub_millisecond_timeout_rounds_up_to_a_whole_millisecond(
    timeout_us: int, ms: int
) -> None:
    req = FrontRequest.from_parameters(X, (), {"timeout": timeout_us}).to_request("m", "", "c")
    assert req.deadline_ms is not None and req.deadline_ms - req.created_ms == ms
