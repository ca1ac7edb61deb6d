"""Shapes numpy cannot hold, and BYTES validated without an object per element.

A zero-element input fits any data (none), so a shape like [2**63-1, 0] once passed
validation and failed in the worker as the model's error. numpy itself is the judge here:
``validate_request`` must accept exactly the shapes numpy can make an array of (the
request's, and the stack of a full batch of it).
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from plaza.contract import InferRequest
from plaza.errors import InvalidInput
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.tensors import Tensor, check_bytes_layout, deserialize_bytes
from plaza.validation import validate_request

BIG = 2**63 - 1


def spec_of(datatype: str, max_batch_size: int) -> ModelSpec:
    config = f"""name: "m" platform: "onnxruntime_onnx" max_batch_size: {max_batch_size}
    input [{{ name: "X" data_type: TYPE_{datatype} dims: [ -1, -1 ] }}]
    output [{{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }}]"""
    return parse_model_config(config, source="test", default_name="m")


def request(datatype: str, shape: tuple[int, ...], data: bytes = b"") -> InferRequest:
    tensor = Tensor("X", "BYTES" if datatype == "STRING" else datatype, shape, data)
    return InferRequest(id="r", model="m", version="", inputs=(tensor,))


def numpy_makes(shape: tuple[int, ...], dtype: Any) -> bool:
    try:
        np.empty(shape, dtype=dtype)
    except ValueError:
        return False
    return True


def test_the_reviewers_shape_is_invalid_input_naming_input_and_shape() -> None:
    with pytest.raises(InvalidInput) as caught:
        validate_request(request("FP32", (BIG, 0)), spec_of("FP32", 0))
    assert caught.value.code == "invalid_input"
    assert "'X'" in caught.value.message
    assert f"[{BIG}, 0]" in caught.value.message


EMPTY_SHAPES = [
    (BIG, 0),
    (2**63, 0),
    (2**64 - 1, 0),
    (0, 2**64),
    (0, BIG),
    (2**62, 0),
    (2**61, 0),
    (2**60, 0),
    (0, 2**59),
    (2**40, 0),
    (0, 0),
]


@pytest.mark.parametrize("datatype", ["UINT8", "FP32", "FP64", "STRING"])
@pytest.mark.parametrize("shape", EMPTY_SHAPES)
def test_an_empty_unbatched_input_is_accepted_exactly_when_numpy_holds_it(
    datatype: str, shape: tuple[int, ...]
) -> None:
    dtype = object if datatype == "STRING" else np.dtype(datatype.lower().replace("fp", "float"))
    req = request(datatype, shape)
    if numpy_makes(shape, dtype):
        assert validate_request(req, spec_of(datatype, 0)) == 1
        assert req.inputs[0].to_numpy().shape == shape  # what the worker does with it
    else:
        with pytest.raises(InvalidInput, match="too large"):
            validate_request(req, spec_of(datatype, 0))


@pytest.mark.parametrize(
    ("rows", "width"), [(1, 2**60), (1, 2**61), (2, 2**61), (1, 2**62), (1, BIG), (4, 2**59)]
)
def test_a_batched_input_must_stack_into_a_full_batch(rows: int, width: int) -> None:
    """The worker stacks up to max_batch_size rows of requests of one shape: a request that
    numpy holds alone but not stacked would fail its batch, so it is refused on its own."""
    shape = (rows, width, 0)
    req = request("UINT8", shape)
    stacked = (4, width, 0)
    if numpy_makes(shape, np.uint8) and numpy_makes(stacked, np.uint8):
        assert validate_request(req, spec_of("UINT8", 4)) == rows
    else:
        with pytest.raises(InvalidInput, match=r"batch of up to 4 rows"):
            validate_request(req, spec_of("UINT8", 4))


def test_a_shape_that_disagrees_with_its_data_keeps_the_clearer_error() -> None:
    """A huge shape with data that cannot fill it says so (the count), as before."""
    with pytest.raises(InvalidInput, match="bytes of data"):
        validate_request(request("FP32", (2**64 - 1, 1), b"\0" * 4), spec_of("FP32", 0))


LAYOUTS = [
    (b"", 0),
    (b"\0\0\0\0" * 3, 3),
    (b"\x02\0\0\0ab" * 3, 3),
    (b"\x01\0\0\0a\x02\0\0\0bc\0\0\0\0", 3),
    (b"\x01\0\0\0a\x02\0\0\0bc", 3),  # truncated
    (b"\x01\0\0\0a\x05\0\0\0bc", 2),  # runs past
    (b"\x01\0\0\0a\0", 1),  # trailing
    (b"\0\0\0\0", 0),  # trailing, nothing declared
    (b"\x02\0\0\0ab\x02\0\0\0ab", 1),
    (b"\x03\0\0\0ab\x01\0\0\0a", 2),  # uniform size, not uniform lengths
    (b"\x01\0\0\0ab\0\0\0", 2),
]


@pytest.mark.parametrize(("data", "count"), LAYOUTS)
def test_the_bytes_walk_agrees_with_decoding(data: bytes, count: int) -> None:
    try:
        deserialize_bytes(data, count)
    except InvalidInput as exc:
        with pytest.raises(InvalidInput) as caught:
            check_bytes_layout(data, count)
        assert caught.value.message == exc.message
    else:
        check_bytes_layout(data, count)


@pytest.mark.parametrize("mixed", [False, True], ids=["uniform", "mixed lengths"])
def test_validating_bytes_makes_no_object_per_element(mixed: bool) -> None:
    """An object array of the elements takes 8 bytes an element (and more for each bytes
    object); validation must not build one (the request's size is not checked yet)."""
    count = 1 << 16
    data = b"\0\0\0\0" * count
    if mixed:
        data += b"\x01\0\0\0a"
        count += 1
    req = request("STRING", (count, 1), data)
    spec = spec_of("STRING", 0)
    tracemalloc.start()
    try:
        validate_request(req, spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * count, f"validation took {peak} bytes for {count} elements"
