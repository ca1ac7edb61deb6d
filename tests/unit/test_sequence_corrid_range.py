"""A sequence id must fit the model's CORRID control: the worker passes it to the model as
a tensor of that type, and an id past the type's range used to pass validation and then
fail numpy in the worker's batch, stopping the worker (and the next owner of the record,
until it was dead-lettered as poison). It is refused as invalid input instead."""

from __future__ import annotations

import numpy as np
import pytest

from plaza.contract import InferRequest
from plaza.errors import InvalidInput
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.tensors import Tensor
from plaza.validation import validate_request

_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
output [{{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}]
sequence_batching {{
  control_input [
    {{ name: "C" control [{{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }}] }}
  ]
}}
"""


def spec(corrid: str) -> ModelSpec:
    return parse_model_config(_CONFIG.format(corrid=corrid), source="t", default_name="m")


def request(sequence_id: int) -> InferRequest:
    x = Tensor.from_numpy("INPUT", np.zeros((1, 1), np.int32))
    params = {"sequence_id": sequence_id, "sequence_start": True}
    return InferRequest(id="r", model="m", version="", inputs=(x,), parameters=params)


@pytest.mark.parametrize(
    ("corrid", "largest"),
    [
        ("TYPE_INT32", 2**31 - 1),
        ("TYPE_UINT32", 2**32 - 1),
        ("TYPE_INT64", 2**63 - 1),
        ("TYPE_UINT64", 2**64 - 1),
    ],
)
def test_a_sequence_id_must_fit_the_corrid_control(corrid: str, largest: int) -> None:
    model = spec(corrid)
    assert validate_request(request(largest), model) == 1
    if largest < 2**64 - 1:  # past UINT64, no sequence id is valid at all
        with pytest.raises(InvalidInput, match=f"past {largest}"):
            validate_request(request(largest + 1), model)
