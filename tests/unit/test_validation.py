"""``validate_request``: requested outputs are the model's, each named once."""

from __future__ import annotations

import numpy as np
import pytest

from plaza.contract import InferRequest
from plaza.errors import InvalidInput
from plaza.modelconfig import parse_model_config
from plaza.tensors import Tensor
from plaza.validation import validate_request

SPEC = parse_model_config(
    """
    name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
    input [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] },
             { name: "z" data_type: TYPE_FP32 dims: [ 2 ] } ]
    """,
    source="m/config.pbtxt",
    default_name="m",
)


def request(*outputs: str) -> InferRequest:
    a = Tensor.from_numpy("a", np.zeros((1, 2), np.float32))
    return InferRequest("r", "m", "", (a,), outputs)


@pytest.mark.parametrize("outputs", [(), ("y",), ("z", "y")])
def test_outputs_of_the_model_each_asked_once_are_valid(outputs: tuple[str, ...]) -> None:
    assert validate_request(request(*outputs), SPEC) == 1


@pytest.mark.parametrize("outputs", [("y", "y"), ("y", "z", "y"), ("z",) * 1000])
def test_an_output_asked_twice_is_invalid_input_naming_it(outputs: tuple[str, ...]) -> None:
    with pytest.raises(InvalidInput) as info:
        validate_request(request(*outputs), SPEC)
    assert info.value.code == "invalid_input"
    assert f"output {outputs[-1]!r} is requested twice" == info.value.message


def test_an_unknown_output_is_still_named_as_unknown() -> None:
    with pytest.raises(InvalidInput, match="unknown output 'nope'"):
        validate_request(request("y", "nope", "nope"), SPEC)
