"""Which outputs Triton's classification extension classifies: the datatypes its
TopkClassifications ranks (the integers, FP32, FP64); BOOL, FP16 and BYTES are refused as
``invalid_input`` (HTTP 400, gRPC INVALID_ARGUMENT), for a model and an ensemble, at the
gateway's validation and at a worker's admission alike (pure logic, no services)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import numpy as np
import pytest

from plaza.client import make_request
from plaza.codec import encode_request
from plaza.datatypes import to_numpy_dtype
from plaza.errors import InvalidInput
from plaza.gateway.errors import grpc_status, http_status
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.naming import Names
from plaza.tensors import Tensor
from plaza.validation import validate_request
from plaza.workers.admission import Rejected, admit
from plaza.workers.classification import classify

RANKED = ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
REFUSED = ("BOOL", "FP16", "BYTES")


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model(datatype: str) -> ModelSpec:
    text = f"""
    name: "m" platform: "onnxruntime_onnx" max_batch_size: 4
    input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }} ]
    output [ {{ name: "p" data_type: {config_type(datatype)} dims: [ 3 ] }} ]
    """
    return parse_model_config(text, source="m/config.pbtxt", default_name="m")


def ensemble(datatype: str) -> ModelSpec:
    text = f"""
    name: "e" platform: "ensemble" max_batch_size: 4
    input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }} ]
    output [ {{ name: "p" data_type: {config_type(datatype)} dims: [ 3 ] }} ]
    ensemble_scheduling {{ step [ {{ model_name: "m" model_version: -1
      input_map {{ key: "x" value: "x" }} output_map {{ key: "p" value: "p" }} }} ] }}
    """
    return parse_model_config(text, source="e/config.pbtxt", default_name="e")


def classifying(spec: ModelSpec) -> bytes:
    req = make_request(spec.name, {"x": np.zeros((1, 3), np.float32)}, classification={"p": 2})
    return encode_request(req)


@pytest.mark.parametrize("datatype", RANKED)
@pytest.mark.parametrize("build", [model, ensemble])
def test_an_output_triton_ranks_may_be_classified(
    datatype: str, build: Callable[[str], ModelSpec]
) -> None:
    spec = build(datatype)
    req = make_request(spec.name, {"x": np.zeros((1, 3), np.float32)}, classification={"p": 2})
    assert validate_request(req, spec) == 1


@pytest.mark.parametrize("datatype", REFUSED)
@pytest.mark.parametrize("build", [model, ensemble])
def test_a_bool_fp16_or_bytes_output_is_refused_as_invalid_input(
    datatype: str, build: Callable[[str], ModelSpec]
) -> None:
    spec = build(datatype)
    req = make_request(spec.name, {"x": np.zeros((1, 3), np.float32)}, classification={"p": 2})
    with pytest.raises(InvalidInput, match=f"output 'p' is {datatype}: ") as err:
        validate_request(req, spec)
    assert err.value.code == "invalid_input"
    assert http_status(err.value) == 400
    assert grpc_status(err.value) == grpc.StatusCode.INVALID_ARGUMENT
    # a producer writing to Kafka directly: the worker (or ensemble runner) answers it so
    verdict = admit(classifying(spec), spec, [1], max_bytes=1 << 20, names=Names())
    assert isinstance(verdict, Rejected) and verdict.result.error is not None
    assert verdict.result.error.code == "invalid_input"
    assert f"output 'p' is {datatype}" in verdict.result.error.message


def test_the_same_request_without_classification_is_valid_for_every_datatype() -> None:
    for datatype in RANKED + REFUSED:
        req = make_request("m", {"x": np.zeros((1, 3), np.float32)})
        assert validate_request(req, model(datatype)) == 1


@pytest.mark.parametrize("datatype", RANKED)
def test_each_ranked_datatype_is_classified_in_its_own_type(datatype: str) -> None:
    values = np.array([[1, 3, 2]], dtype=to_numpy_dtype(datatype))
    top = classify(Tensor.from_numpy("p", values), 2, batched=True)
    shown = ("3.000000:1", "2.000000:2") if datatype.startswith("FP") else ("3:1", "2:2")
    assert top.to_numpy().astype(str).tolist() == [list(shown)]
