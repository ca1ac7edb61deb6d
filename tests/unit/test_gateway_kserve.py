"""KServe v2 bodies <-> Plaza tensors: JSON and binary round trips, and every malformed body."""

from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.http import InferResult as TritonResult

from plaza.contract import InferResult
from plaza.errors import InvalidInput
from plaza.gateway import kserve
from plaza.modelconfig import parse_model_config
from plaza.tensors import Tensor


def _json_body(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc)


def _binary_body(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    header = orjson.dumps(doc)
    return header + b"".join(blobs), len(header)


def _input(name: str, datatype: str, shape: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, **extra}


def _triton_body(
    inputs: list[httpclient.InferInput], outputs: list[httpclient.InferRequestedOutput] | None
) -> tuple[bytes, int | None]:
    """The exact body tritonclient would send (its own request builder)."""
    from tritonclient.http._utils import _get_inference_request

    body, length = _get_inference_request(
        inputs, "client-7", outputs, 0, False, False, 0, None, None
    )
    return body, length


# -- JSON requests --------------------------------------------------------------------------


def test_json_flat_and_nested_data_decode_to_the_same_bytes() -> None:
    flat = _input("INPUT0", "FP32", [2, 2], data=[1, 2, 3, 4.5])
    nested = _input("INPUT0", "FP32", [2, 2], data=[[1, 2], [3, 4.5]])
    a = kserve.decode_infer_request(_json_body({"inputs": [flat]}))
    b = kserve.decode_infer_request(_json_body({"inputs": [nested]}))
    expected = np.array([[1, 2], [3, 4.5]], dtype=np.float32)
    for body in (a, b):
        np.testing.assert_array_equal(body.inputs[0].to_numpy(), expected)
        assert body.inputs[0].shape == (2, 2)


@pytest.mark.parametrize(
    ("datatype", "data", "dtype"),
    [
        ("INT32", [1, -2, 3], np.int32),
        ("INT64", [2**40, 0, -1], np.int64),
        ("UINT8", [0, 255, 7], np.uint8),
        ("FP64", [0.5, 1, -3], np.float64),
        ("FP16", [0.5, 1, -3], np.float16),
        ("BOOL", [True, False, True], np.bool_),
    ],
)
def test_json_numeric_datatypes(datatype: str, data: list[Any], dtype: Any) -> None:
    body = kserve.decode_infer_request(
        _json_body({"inputs": [_input("X", datatype, [3], data=data)]})
    )
    np.testing.assert_array_equal(body.inputs[0].to_numpy(), np.array(data, dtype=dtype))


_FLOAT_LISTS: list[list[Any]] = [
    [0.1, -2.5, 3e-39, 1e-45, 65504.0, -0.0],  # subnormals of FP32, FP16's largest
    [1, 2, -3, 2**31, 2**53],  # integers: exact as doubles
    [1.5, True, False, 7],  # a boolean among numbers is 1 or 0, as numpy reads it
    [3.4028235e38, -3.4028235e38, 1.0000001],
    [0.333333333333333, 2.7182818284590455, 1e-300],
]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
@pytest.mark.parametrize("data", _FLOAT_LISTS, ids=range(len(_FLOAT_LISTS)))
def test_flat_float_lists_decode_as_numpy_converts_them(datatype: str, data: list[Any]) -> None:
    """The packed path (a flat list of numbers) gives numpy's bytes, or leaves the list to
    the general path where a value is past the datatype's range."""
    body = _json_body({"inputs": [_input("X", datatype, [len(data)], data=data)]})
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    with np.errstate(over="ignore"):
        expected = np.asarray(data).astype(dtype)
    if not np.isfinite(expected).all():
        assert kserve._packed_floats(datatype, data) is None
        with pytest.raises(InvalidInput, match=f"out of range for {datatype}"):
            kserve.decode_infer_request(body)
        return
    assert kserve._packed_floats(datatype, data) is not None
    (tensor,) = kserve.decode_infer_request(body).inputs
    assert bytes(tensor.data) == expected.tobytes()


@pytest.mark.parametrize(
    "data",
    [[], [True, False], [True, 1.5], [[1.0, 2.0]], [1.0, "a"], [1.0, None], [1.0, [2.0]]],
    ids=["empty", "booleans", "boolean first", "nested", "string", "null", "nested later"],
)
def test_lists_the_packed_path_leaves_to_numpy(data: list[Any]) -> None:
    assert kserve._packed_floats("FP32", data) is None


def test_a_float_input_of_booleans_alone_is_refused_and_after_a_number_is_read() -> None:
    only = {"inputs": [_input("X", "FP32", [2], data=[True, False])]}
    with pytest.raises(InvalidInput, match="boolean values, not FP32"):
        kserve.decode_infer_request(_json_body(only))
    mixed = {"inputs": [_input("X", "FP32", [2], data=[0.5, True])]}
    (tensor,) = kserve.decode_infer_request(_json_body(mixed)).inputs
    assert tensor.to_numpy().tolist() == [0.5, 1.0]


_NON_FINITE = [1.5, np.nan, np.inf, -np.inf, 0.1, -0.0]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
@pytest.mark.parametrize("shape", [[6], [2, 3]], ids=["flat", "nested"])
def test_json_nan_and_infinity_tokens_are_float_values(datatype: str, shape: list[int]) -> None:
    """Triton reads NaN, Infinity and -Infinity (rapidjson's kParseNanAndInfFlag), and
    tritonclient writes them for such values: they were 400 (orjson refuses them)."""
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    values = np.array(_NON_FINITE, dtype=dtype).reshape(shape)
    client_input = httpclient.InferInput("X", shape, datatype)
    client_input.set_data_from_numpy(values, binary_data=False)
    raw, length = _triton_body([client_input], None)
    assert b"NaN" in raw and b"-Infinity" in raw
    (tensor,) = kserve.decode_infer_request(raw, length).inputs
    np.testing.assert_array_equal(tensor.to_numpy(), values)
    assert np.signbit(tensor.to_numpy()).tolist() == np.signbit(values).tolist()


_NON_FINITE_BAD: list[tuple[str, bytes, str]] = [
    ("fp64 literal past a double", b"[NaN, 1e400]", "1e400 is infinity when parsed as double"),
    ("fp32 overflow", b"[Infinity, 1e300]", "out of range for FP32"),
    ("fp32 overflow first", b"[1e300, -Infinity]", "out of range for FP32"),
    ("lowercase", b"[1, nan]", "not valid JSON"),
    ("minus NaN", b"[-NaN, 1]", "not valid JSON"),
    ("Inf", b"[Inf, 1]", "not valid JSON"),
    ("string", b'[NaN, "a"]', "string values, not FP32"),
    ("trailing garbage", b"[NaN, 1]]", "not valid JSON"),
]


@pytest.mark.parametrize(
    ("case", "data", "message"), _NON_FINITE_BAD, ids=[c[0] for c in _NON_FINITE_BAD]
)
def test_non_finite_tokens_leave_bad_values_refused(case: str, data: bytes, message: str) -> None:
    """Only the three tokens are new: a literal past a double's range, a finite value past
    FP32's and anything else malformed stay 400 on the slow path too."""
    raw = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": %s}]}' % data
    with pytest.raises(InvalidInput, match=re.escape(message)) as info:
        kserve.decode_infer_request(raw)
    assert info.value.code == "invalid_input"


def test_the_slow_json_path_reads_strings_and_integers_as_orjson_does() -> None:
    head = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [NaN, '
    big = kserve.decode_infer_request(head + b"1" + b"0" * 30 + b"]}]}")  # a float, as orjson
    assert big.inputs[0].to_numpy()[1] == np.float32(1e30)
    paired = kserve.decode_infer_request(head + b'1]}], "id": "\\ud83d\\ude00"}')
    assert paired.client_id == "\U0001f600"
    with pytest.raises(InvalidInput, match="surrogates not allowed"):
        kserve.decode_infer_request(head + b'1]}], "id": "\\ud800"}')
    deep = head + b"[" * 5000 + b"]" * 5000 + b"]}]}"
    with pytest.raises(InvalidInput, match="not valid JSON"):
        kserve.decode_infer_request(deep)


def test_json_bytes_are_strings_in_tritons_layout() -> None:
    body = kserve.decode_infer_request(
        _json_body({"inputs": [_input("T", "BYTES", [2, 1], data=[["héllo"], [""]])]})
    )
    tensor = body.inputs[0]
    assert bytes(tensor.data) == struct.pack("<I", 6) + "héllo".encode() + struct.pack("<I", 0)
    assert tensor.to_numpy().tolist() == [[b"h\xc3\xa9llo"], [b""]]


def test_request_fields_and_parameters() -> None:
    doc = {
        "id": "client-label",
        "inputs": [_input("X", "INT32", [1], data=[1])],
        "outputs": [{"name": "A", "parameters": {"binary_data": True}}, {"name": "B"}],
        "parameters": {"binary_data_output": False, "timeout": 250_000, "priority": 2, "k": "v"},
    }
    body = kserve.decode_infer_request(_json_body(doc))
    assert body.client_id == "client-label"
    assert body.timeout_us == 250_000 and body.request.priority == 2
    assert body.request.parameters == {"k": "v"}
    assert body.wants_binary("A") and not body.wants_binary("B")
    req = body.to_request("m", "1", "corr-1")
    assert req.id == "corr-1" and req.model == "m" and req.version == "1"
    assert req.outputs == ("A", "B") and req.priority == 2
    assert req.deadline_ms is not None and req.deadline_ms - req.created_ms == 250


def test_no_timeout_means_no_deadline() -> None:
    body = kserve.decode_infer_request(
        _json_body({"inputs": [_input("X", "INT32", [1], data=[1])]})
    )
    assert body.to_request("m", "", "c").deadline_ms is None
    assert body.client_id is None and not body.wants_binary("anything")


# -- binary requests ------------------------------------------------------------------------


def test_binary_inputs_are_zero_copy_slices_in_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, 8], dtype=np.int64)
    doc = {
        "inputs": [
            _input("A", "FP32", [2, 3], parameters={"binary_data_size": a.nbytes}),
            _input("J", "INT32", [1], data=[5]),
            _input("B", "INT64", [2], parameters={"binary_data_size": b.nbytes}),
        ]
    }
    raw, length = _binary_body(doc, a.tobytes(), b.tobytes())
    body = kserve.decode_infer_request(raw, length)
    got = {t.name: t for t in body.inputs}
    np.testing.assert_array_equal(got["A"].to_numpy(), a)
    np.testing.assert_array_equal(got["B"].to_numpy(), b)
    assert got["J"].to_numpy().tolist() == [5]
    assert isinstance(got["A"].data, memoryview)


def test_tritonclient_request_bodies_decode() -> None:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    s = np.array([[b"ab", b"\x00\xff"]], dtype=object)
    binary_in = httpclient.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(x)
    bytes_in = httpclient.InferInput("S", [1, 2], "BYTES").set_data_from_numpy(s)
    json_in = httpclient.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(
        x, binary_data=False
    )
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    raw, length = _triton_body([binary_in, bytes_in, json_in], outputs)
    body = kserve.decode_infer_request(raw, length)
    got = {t.name: t.to_numpy() for t in body.inputs}
    np.testing.assert_array_equal(got["INPUT0"], x)
    np.testing.assert_array_equal(got["INPUT1"], x)
    assert got["S"].tolist() == [[b"ab", b"\x00\xff"]]
    assert body.client_id == "client-7" and body.wants_binary("OUTPUT0")


def test_tritonclient_without_outputs_asks_binary_for_all() -> None:
    x = np.ones((1, 4), dtype=np.float32)
    raw, length = _triton_body(
        [httpclient.InferInput("I", [1, 4], "FP32").set_data_from_numpy(x)], None
    )
    body = kserve.decode_infer_request(raw, length)
    assert body.binary_output and body.wants_binary("whatever")


# -- responses ------------------------------------------------------------------------------


def _result(*outputs: Tensor) -> InferResult:
    return InferResult(id="corr", model="m", version="1", outputs=outputs)


def _as_triton(body: kserve.EncodedBody) -> TritonResult:
    return TritonResult.from_response_body(body.content, header_length=body.header_length)


def test_json_response_round_trips_through_tritonclient() -> None:
    f = np.array([[1.5, -2]], dtype=np.float32)
    s = np.array([b"x", "ü".encode()], dtype=object)
    body = kserve.encode_infer_response(
        _result(Tensor.from_numpy("F", f), Tensor.from_numpy("S", s)),
        response_id="client",
        binary=lambda _: False,
    )
    assert body.header_length is None and body.content_type == "application/json"
    doc = orjson.loads(body.content)
    assert doc["id"] == "client" and doc["model_name"] == "m" and doc["model_version"] == "1"
    assert doc["outputs"][0] == {
        "name": "F",
        "datatype": "FP32",
        "shape": [1, 2],
        "data": [1.5, -2.0],
    }
    assert doc["outputs"][1]["data"] == ["x", "ü"]
    result = _as_triton(body)
    np.testing.assert_array_equal(result.as_numpy("F"), f)


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_non_finite_outputs_are_written_as_tokens(datatype: str) -> None:
    """Triton writes NaN, Infinity and -Infinity (rapidjson's kWriteNanAndInfFlag); orjson
    wrote null for all three, which tritonclient reads as NaN: +inf came back as NaN."""
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    values = np.array(_NON_FINITE, dtype=dtype).reshape(2, 3)
    finite = np.array([[0.1, 2.5]], dtype=dtype)
    result = _result(Tensor.from_numpy("F", values), Tensor.from_numpy("G", finite))
    body = kserve.encode_infer_response(result, response_id="r", binary=lambda _: False)
    assert b"null" not in body.content
    # the finite values keep orjson's digits (its shortest form of each width's 0.1)
    digits = orjson.dumps(np.array([0.1], dtype), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
    assert b'"data":[1.5,NaN,Infinity,-Infinity,%s,-0.0]' % digits in body.content
    read = _as_triton(body)
    np.testing.assert_array_equal(read.as_numpy("F"), values)
    np.testing.assert_array_equal(read.as_numpy("G"), finite)
    polled = kserve.encode_json(kserve.result_doc(result, "j"))  # a decoupled job's answer
    assert b'"data":[1.5,NaN,Infinity,-Infinity,' in polled


def test_binary_response_round_trips_through_tritonclient() -> None:
    f = np.arange(12, dtype=np.float16).reshape(3, 4)
    i = np.array([1, 2, 3], dtype=np.int64)
    s = np.array([[b"a\x00b"], [b""]], dtype=object)
    outputs = (Tensor.from_numpy("F", f), Tensor.from_numpy("I", i), Tensor.from_numpy("S", s))
    body = kserve.encode_infer_response(
        _result(*outputs), response_id="r", binary=lambda name: name != "I"
    )
    assert body.header_length is not None and body.content_type == "application/octet-stream"
    header = orjson.loads(body.content[: body.header_length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": f.nbytes}
    assert header["outputs"][1]["data"] == [1, 2, 3]
    result = _as_triton(body)
    np.testing.assert_array_equal(result.as_numpy("F"), f)
    np.testing.assert_array_equal(result.as_numpy("I"), i)
    assert result.as_numpy("S").tolist() == [[b"a\x00b"], [b""]]


PARAMS = {"a": 1, "b": "x", "c": True}


def test_a_responses_parameters_are_its_top_level_parameters_object() -> None:
    """KServe v2's ``"parameters": {...}`` beside ``outputs``, in JSON and binary bodies,
    read back by tritonclient's own ``get_response()``; absent when there are none."""
    y = Tensor.from_numpy("Y", np.array([[3]], np.int32))
    annotated = InferResult(id="c", model="m", version="1", outputs=(y,), parameters=PARAMS)
    for binary in (False, True):
        body = kserve.encode_infer_response(
            annotated, response_id="r", binary=lambda _, b=binary: b
        )
        response = _as_triton(body).get_response()
        assert response["parameters"] == PARAMS and type(response["parameters"]["c"]) is bool
        assert _as_triton(body).as_numpy("Y").tolist() == [[3]]
    polled = kserve.encode_infer_response(
        annotated, response_id="j", binary=lambda _: False, extra={"status": "done"}
    )
    assert orjson.loads(polled.content)["parameters"] == PARAMS  # a polled job's answer
    assert kserve.result_doc(annotated, "j")["parameters"] == PARAMS  # a decoupled job's
    plain = kserve.encode_infer_response(_result(y), response_id="r", binary=lambda _: False)
    assert "parameters" not in orjson.loads(plain.content)
    assert "parameters" not in kserve.result_doc(_result(y), "j")


def test_extra_fields_and_metadata() -> None:
    body = kserve.encode_infer_response(
        _result(), response_id="j", binary=lambda _: False, extra={"status": "done"}
    )
    assert orjson.loads(body.content)["status"] == "done"
    spec = parse_model_config(
        'name: "m" platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [{ name: "I" data_type: TYPE_FP32 dims: [ 4 ] }] '
        'output [{ name: "O" data_type: TYPE_STRING dims: [ -1 ] }]',
        source="mem",
        default_name="m",
    )
    meta = kserve.model_metadata(spec, [1, 3])
    assert meta == {
        "name": "m",
        "versions": ["1", "3"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "I", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "O", "datatype": "BYTES", "shape": [-1, -1]}],
    }
    assert kserve.server_metadata("0.1", ["a"]) == {
        "name": "plaza",
        "version": "0.1",
        "extensions": ["a"],
    }


# -- malformed bodies -----------------------------------------------------------------------


def _nested(datatype: str, leaf: str, depth: int) -> bytes:
    """A body whose input holds ``leaf`` inside ``depth`` lists (written by hand: orjson.dumps
    stops at 255 levels, orjson.loads reads up to 1024)."""
    data = "[" * depth + leaf + "]" * depth
    text = (
        f'{{"inputs": [{{"name": "X", "datatype": "{datatype}", "shape": [1], "data": {data}}}]}}'
    )
    return text.encode()


_GOOD = _input("X", "FP32", [2], data=[1, 2])
_MALFORMED_JSON: list[tuple[str, Any, str]] = [
    ("not json", b"{nope", "not valid JSON"),
    ("not an object", b"[1, 2]", "must be a JSON object"),
    ("no inputs", {"id": "x"}, "'inputs' must be a non-empty list"),
    ("empty inputs", {"inputs": []}, "'inputs' must be a non-empty list"),
    ("input not object", {"inputs": [3]}, "inputs[0] must be a JSON object"),
    ("no name", {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, "needs a non-empty"),
    ("unknown datatype", {"inputs": [_input("X", "FP31", [1], data=[1])]}, "unknown datatype"),
    ("bad shape", {"inputs": [_input("X", "FP32", [-1], data=[1])]}, "'shape' must be"),
    ("bool shape", {"inputs": [_input("X", "FP32", [True], data=[1])]}, "'shape' must be"),
    ("no data", {"inputs": [_input("X", "FP32", [1])]}, "needs 'data'"),
    ("count mismatch", {"inputs": [_input("X", "FP32", [3], data=[1, 2])]}, "2 data elements"),
    ("ragged", {"inputs": [_input("X", "FP32", [3], data=[[1, 2], [3]])]}, "not a regular array"),
    ("string in numbers", {"inputs": [_input("X", "FP32", [2], data=[1, "a"])]}, "string values"),
    ("float for int", {"inputs": [_input("X", "INT32", [1], data=[1.5])]}, "float values"),
    ("int for bool", {"inputs": [_input("X", "BOOL", [1], data=[1])]}, "integer values"),
    ("overflow", {"inputs": [_input("X", "UINT8", [1], data=[256])]}, "out of range"),
    (
        "uint8 negative",
        {"inputs": [_input("X", "UINT8", [1], data=[-1])]},
        "out of range for UINT8",
    ),
    (
        "int8 overflow",
        {"inputs": [_input("X", "INT8", [2], data=[1, 300])]},
        "out of range for INT8",
    ),
    ("int16 overflow", {"inputs": [_input("X", "INT16", [1], data=[40000])]}, "range for INT16"),
    ("uint32 overflow", {"inputs": [_input("X", "UINT32", [1], data=[2**32])]}, "range for UINT32"),
    ("int64 overflow", {"inputs": [_input("X", "INT64", [1], data=[2**63])]}, "range for INT64"),
    (  # orjson reads integers past 64 bits as floats
        "int64 far overflow",
        b'{"inputs": [{"name": "X", "datatype": "INT64", "shape": [1], "data": [1%s]}]}'
        % (b"0" * 30),
        "float values, not INT64",
    ),
    ("float among ints", {"inputs": [_input("X", "UINT64", [2], data=[-1, 0.5])]}, "float values"),
    ("uint64 negative", {"inputs": [_input("X", "UINT64", [1], data=[-5])]}, "range for UINT64"),
    ("fp32 overflow", {"inputs": [_input("X", "FP32", [2], data=[1, 1e300])]}, "range for FP32"),
    ("fp32 underflow", {"inputs": [_input("X", "FP32", [1], data=[-1e39])]}, "range for FP32"),
    ("fp16 overflow", {"inputs": [_input("X", "FP16", [1], data=[1e10])]}, "range for FP16"),
    ("fp16 int overflow", {"inputs": [_input("X", "FP16", [1], data=[70000])]}, "range for FP16"),
    (
        "json infinity",
        b'{"inputs": [{"name": "X", "datatype": "FP64", "shape": [1], "data": [1e400]}]}',
        "not valid JSON",
    ),
    (
        "bytes nested 1000 deep",
        _nested("BYTES", '"a"', 1000),
        "nested deeper than 64",
    ),
    (
        "numbers nested 1000 deep",
        _nested("FP32", "1", 1000),
        "not a regular array",
    ),
    ("null data", {"inputs": [_input("X", "FP32", [1], data=[None])]}, "non-numeric values"),
    ("bytes not str", {"inputs": [_input("X", "BYTES", [1], data=[1])]}, "must be strings"),
    ("bad id", {"id": 5, "inputs": [_GOOD]}, "'id' must be a string"),
    ("bad params", {"inputs": [_GOOD], "parameters": [1]}, "'parameters' must be a JSON object"),
    ("nested param", {"inputs": [_GOOD], "parameters": {"a": {"b": 1}}}, "must be a string"),
    ("bad timeout", {"inputs": [_GOOD], "parameters": {"timeout": -1}}, "non-negative integer"),
    ("bad flag", {"inputs": [_GOOD], "parameters": {"binary_data_output": 1}}, "true or false"),
    ("outputs not list", {"inputs": [_GOOD], "outputs": {"name": "O"}}, "'outputs' must be a list"),
    ("output no name", {"inputs": [_GOOD], "outputs": [{}]}, "outputs[0] must be an object"),
    (
        "output bad binary",
        {"inputs": [_GOOD], "outputs": [{"name": "O", "parameters": {"binary_data": "yes"}}]},
        "'binary_data' must be true or false",
    ),
    (
        "classification of none",
        {"inputs": [_GOOD], "outputs": [{"name": "O", "parameters": {"classification": 0}}]},
        "'classification' must be an integer >= 1",
    ),
    (
        "classification on the request",
        {"inputs": [_GOOD], "parameters": {"classification": 3}},
        "request parameter 'classification' is not supported",
    ),
    (
        "shared memory on an output without its byte size",
        {
            "inputs": [_GOOD],
            "outputs": [{"name": "O", "parameters": {"shared_memory_region": "r"}}],
        },
        "output 'O': shared memory needs both",
    ),
    (
        "shared memory on the request",
        {"inputs": [_GOOD], "parameters": {"shared_memory_region": "r"}},
        "request parameter 'shared_memory_region' is not supported",
    ),
    (
        "binary without header",
        {"inputs": [_input("X", "FP32", [1], parameters={"binary_data_size": 4})]},
        "no Inference-Header-Content-Length",
    ),
]


@pytest.mark.parametrize(
    ("case", "doc", "message"), _MALFORMED_JSON, ids=[c[0] for c in _MALFORMED_JSON]
)
def test_malformed_json_bodies(case: str, doc: Any, message: str) -> None:
    raw = doc if isinstance(doc, bytes) else _json_body(doc)
    with pytest.raises(InvalidInput, match=re.escape(message)) as info:
        kserve.decode_infer_request(raw)
    assert info.value.code == "invalid_input"


def _bin_doc(size: Any, **extra: Any) -> dict[str, Any]:
    return {"inputs": [_input("X", "FP32", [2], parameters={"binary_data_size": size}, **extra)]}


_MALFORMED_BINARY: list[tuple[str, dict[str, Any], bytes, int | None, str]] = [
    ("header past body", _bin_doc(8), b"\0" * 8, 10_000, "outside the body"),
    ("zero header", _bin_doc(8), b"\0" * 8, 0, "outside the body"),
    ("size past body", _bin_doc(8), b"\0" * 4, None, "runs past the body"),
    ("size vs shape", _bin_doc(4), b"\0" * 4, None, "needs 8 bytes"),
    ("trailing bytes", _bin_doc(8), b"\0" * 12, None, "add up to 8"),
    ("negative size", _bin_doc(-8), b"", None, "non-negative integer"),
    ("data and binary", _bin_doc(8, data=[1, 2]), b"\0" * 8, None, "both 'data'"),
]


@pytest.mark.parametrize(
    ("case", "doc", "blob", "length", "message"),
    _MALFORMED_BINARY,
    ids=[c[0] for c in _MALFORMED_BINARY],
)
def test_malformed_binary_bodies(
    case: str, doc: dict[str, Any], blob: bytes, length: int | None, message: str
) -> None:
    raw, header_length = _binary_body(doc, blob)
    with pytest.raises(InvalidInput, match=re.escape(message)) as info:
        kserve.decode_infer_request(raw, header_length if length is None else length)
    assert info.value.code == "invalid_input"


@pytest.mark.parametrize("value", ["abc", "-3", "1.5", "", "²", "١٢", "+4", "1_0"])
def test_bad_header_length_values(value: str) -> None:
    with pytest.raises(InvalidInput, match="must be an integer"):
        kserve.parse_header_length(value)


def test_header_length_values() -> None:
    assert kserve.parse_header_length(None) is None
    assert kserve.parse_header_length(" 42 ") == 42


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP16", [65504.0, -65504.0]),
        ("FP32", [3.4e38, -3.4e38]),
        ("FP64", [1e300, -1e300]),
        ("INT8", [-128, 127]),
        ("UINT8", [0, 255]),
        ("INT64", [-(2**63), 2**63 - 1]),
        ("UINT64", [0, 2**64 - 1]),
    ],
)
def test_values_at_the_edge_of_their_range_decode(datatype: str, data: list[Any]) -> None:
    doc = {"inputs": [_input("X", datatype, [2], data=data)]}
    (tensor,) = kserve.decode_infer_request(_json_body(doc)).inputs
    values = tensor.to_numpy()
    assert np.isfinite(values).all()
    assert np.allclose(values.astype(float), np.array(data, dtype=float), rtol=1e-3)
    if values.dtype.kind in "iu":
        assert values.tolist() == data


def test_bytes_nested_to_the_limit_decode() -> None:
    body = _nested("BYTES", '"a"', kserve.MAX_NESTING)
    (tensor,) = kserve.decode_infer_request(body).inputs
    assert tensor.to_numpy().tolist() == [b"a"]


def test_empty_tensors_decode() -> None:
    doc = {"inputs": [_input("X", "FP32", [1, 0], data=[]), _input("S", "BYTES", [0], data=[])]}
    body = kserve.decode_infer_request(_json_body(doc))
    assert [t.to_numpy().shape for t in body.inputs] == [(1, 0), (0,)]


def test_an_outputs_classification_becomes_the_requests_counts() -> None:
    doc = {
        "inputs": [_GOOD],
        "outputs": [{"name": "O", "parameters": {"classification": 3}}, {"name": "P"}],
    }
    body = kserve.decode_infer_request(_json_body(doc))
    req = body.to_request("m", "", "id1")
    assert req.outputs == ("O", "P") and req.classification == {"O": 3}
    assert "classification" not in req.parameters
