"""A ``sequence_id`` of a type Triton refuses (a double or a bool: Triton takes int64,
uint64 or a string) is refused as such by a stateful model, over HTTP and gRPC alike, not
taken for a request without one; a model without sequences still ignores it. A gRPC
stream keeps such requests in order by their typed id."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

from plaza.contract import InferRequest
from plaza.errors import InvalidInput
from plaza.gateway import grpc_codec, kserve
from plaza.gateway.grpc_front import _sequence_key
from plaza.modelconfig import parse_model_config
from plaza.sequence_batching import sequence_flags
from plaza.validation import validate_request

_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
{extra}
"""
STATEFUL = parse_model_config(
    _CONFIG.format(extra="sequence_batching { }"), source="t", default_name="m"
)
STATELESS = parse_model_config(_CONFIG.format(extra=""), source="t", default_name="m")

WRONG = [(1.5, "double"), (7.0, "double"), (True, "bool"), (False, "bool")]


def _over_http(params: dict[str, object]) -> InferRequest:
    """A request as the HTTP front decodes its JSON body."""
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [5]}],
        "parameters": params,
    }
    front = kserve.decode_infer_request(orjson.dumps(body)).request
    return InferRequest(
        id="r", model="m", version="", inputs=front.inputs, parameters=front.parameters
    )


def _grpc_message(params: dict[str, object]) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    item = msg.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    item.contents.int_contents.append(5)
    for key, value in params.items():
        param = msg.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, int):
            param.int64_param = value
        else:
            param.string_param = str(value)
    return msg


def _over_grpc(params: dict[str, object]) -> InferRequest:
    """A request as the gRPC front decodes its message (double_param, bool_param, ...)."""
    front = grpc_codec.decode_infer_request(_grpc_message(params))
    return InferRequest(
        id="r", model="m", version="", inputs=front.inputs, parameters=front.parameters
    )


Front = Callable[[dict[str, object]], InferRequest]
FRONTS = pytest.mark.parametrize("front", [_over_http, _over_grpc], ids=["http", "grpc"])


@FRONTS
@pytest.mark.parametrize(("value", "kind"), WRONG)
def test_a_stateful_model_refuses_an_id_of_another_type_by_its_type(
    front: Front, value: object, kind: str
) -> None:
    req = front({"sequence_id": value, "sequence_start": True})
    with pytest.raises(
        InvalidInput, match=f"sequence_id must be an integer or a string, got {kind}$"
    ):
        validate_request(req, STATEFUL)


@FRONTS
@pytest.mark.parametrize("name", ["sequence_start", "sequence_end"])
def test_a_flag_of_another_type_is_refused_by_its_type(front: Front, name: str) -> None:
    req = front({"sequence_id": 3, name: 1})
    with pytest.raises(InvalidInput, match=f"'{name}' must be true or false, got integer$"):
        validate_request(req, STATEFUL)


@FRONTS
def test_a_request_without_an_id_is_still_told_it_needs_one(front: Front) -> None:
    nothing: list[dict[str, object]] = [{}, {"sequence_id": ""}]
    for params in nothing:
        with pytest.raises(InvalidInput, match="needs a sequence_id"):
            validate_request(front(params), STATEFUL)


@FRONTS
@pytest.mark.parametrize(("value", "kind"), WRONG)
def test_a_model_without_sequences_ignores_the_parameters(
    front: Front, value: object, kind: str
) -> None:
    req = front({"sequence_id": value, "sequence_start": 1})
    assert validate_request(req, STATELESS) == 1


def test_the_code_is_invalid_input() -> None:
    with pytest.raises(InvalidInput) as caught:
        sequence_flags({"sequence_id": 2.5}, "m")
    assert caught.value.code == "invalid_input"


def test_a_stream_orders_requests_by_their_typed_id() -> None:
    def key(value: object) -> object:
        return _sequence_key(_grpc_message({"sequence_id": value}))

    uint = _grpc_message({})
    uint.parameters["sequence_id"].uint64_param = 7
    assert key(7) == _sequence_key(uint) == ("int", 7)  # int64 and uint64: one sequence
    assert key(7.0) == ("float", 7.0)  # kept in order, but not sequence 7
    assert key(True) == ("bool", True)
    assert key(False) == ("bool", False)
    assert key("a") == ("str", "a")
    assert key(0) is None and key("") is None and _sequence_key(_grpc_message({})) is None
