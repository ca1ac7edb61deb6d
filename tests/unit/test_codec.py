"""Codec round trips (hypothesis) and the errors malformed envelopes get."""

from __future__ import annotations

from typing import Any, get_args

import msgpack
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from plaza.codec import (
    _ENCODER,
    _Datatype,
    _decode_checked,
    _result_from_map,
    _result_to_map,
    _WireRequest,
    _WireResult,
    decode_request,
    decode_result,
    decode_results,
    encode_request,
    encode_result,
    encode_results,
    entry_count,
    join_results,
)
from plaza.connections import key_partition
from plaza.contract import (
    NO_PARAMETERS,
    ErrorInfo,
    InferRequest,
    InferResult,
    ReplyTo,
    new_correlation_id,
)
from plaza.datatypes import DATATYPES
from plaza.errors import CodecError, InvalidInput, UnsupportedVersion
from plaza.tensors import Tensor

NUMERIC = [
    "bool",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
]

arrays = st.sampled_from(NUMERIC).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=1, max_dims=4, max_side=5))
)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    arrays=st.lists(arrays, min_size=1, max_size=3),
    rid=names,
    model=st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
    deadline=st.none() | st.integers(0, 2**53),
    priority=st.integers(0, 5),
    stream=st.none() | names,
)
def test_request_round_trip(arrays, rid, model, deadline, priority, stream) -> None:
    tensors = tuple(Tensor.from_numpy(f"in{i}", a) for i, a in enumerate(arrays))
    req = InferRequest(
        id=rid,
        model=model,
        version="3",
        inputs=tensors,
        outputs=("out",),
        reply=ReplyTo(stream=stream),
        deadline_ms=deadline,
        priority=priority,
        parameters={"k": 1, "s": "v"},
        created_ms=123,
        sent_us=1_700_000_000_123_456,
    )
    encoded = encode_request(req)
    back = decode_request(encoded)
    assert back == _decode_checked(encoded)  # the typed decoder agrees with the checked one
    assert back.sent_us == req.sent_us
    assert decode_request(encode_request(req, sent_us=42)).sent_us == 42  # the publisher's stamp
    assert (back.id, back.model, back.version, back.outputs) == (rid, model, "3", ("out",))
    assert (back.deadline_ms, back.priority, back.reply.stream) == (deadline, priority, stream)
    assert back.parameters == {"k": 1, "s": "v"} and back.created_ms == 123
    for original, decoded in zip(arrays, back.inputs, strict=True):
        out = decoded.to_numpy()
        assert out.dtype == original.dtype.newbyteorder("<")
        np.testing.assert_array_equal(out, original)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.binary(max_size=20) | st.text(max_size=10), min_size=1, max_size=6))
def test_bytes_tensor_round_trip(values) -> None:
    arr = np.array(values, dtype=object)
    tensor = Tensor.from_numpy("b", arr)
    assert tensor.datatype == "BYTES"
    back = decode_request(encode_request(InferRequest("i", "m", "", (tensor,)))).inputs[0]
    expected = [v.encode() if isinstance(v, str) else v for v in values]
    assert list(back.to_numpy()) == expected


def test_a_bytes_element_that_is_not_bytes_is_its_text() -> None:
    """As Triton's clients serialise an object array: ``str(item)`` in UTF-8 (``bytes(22)``
    would have been 22 zero bytes, sent without a word)."""
    arr = np.array([1, np.int64(22), 1.5, "abc", b"raw"], dtype=object)
    back = Tensor.from_numpy("s", arr).to_numpy()
    assert list(back) == [b"1", b"22", b"1.5", b"abc", b"raw"]


@pytest.mark.parametrize(
    "scalar",
    [np.array(5, np.int64), np.float32(2.5), np.array(True), np.array("x", dtype=object)],
    ids=["0-d int64", "numpy scalar", "0-d bool", "0-d bytes"],
)
def test_a_scalar_keeps_its_empty_shape(scalar: Any) -> None:
    tensor = Tensor.from_numpy("s", scalar)
    assert tensor.shape == ()  # it was (1,) for every type but BYTES
    assert tensor.to_numpy().shape == ()


def test_decode_is_zero_copy_over_the_message() -> None:
    arr = np.arange(1000, dtype=np.float32)
    back = decode_request(
        encode_request(InferRequest("i", "m", "", (Tensor.from_numpy("x", arr),)))
    )
    out = back.inputs[0].to_numpy()
    assert not out.flags.owndata and not out.flags.writeable  # a view over the decoded bin


def test_result_round_trip_single_and_packed() -> None:
    ok = InferResult(
        "a",
        "m",
        "1",
        (Tensor.from_numpy("y", np.ones((2, 3), np.float32)),),
        timing_us={"queue": 5},
        worker="w",
    )
    bad = InferResult("b", "m", "1", error=ErrorInfo("invalid_input", "nope"))
    one = decode_result(encode_result(ok))
    assert one.status == "ok" and one.timing_us == {"queue": 5} and one.worker == "w"
    np.testing.assert_array_equal(one.output("y").to_numpy(), np.ones((2, 3), np.float32))
    both = decode_results(encode_results([ok, bad]))
    assert [r.id for r in both] == ["a", "b"]
    assert both[1].status == "error" and both[1].error == ErrorInfo("invalid_input", "nope")


def test_a_decoupled_models_responses_keep_their_index_and_final_flag() -> None:
    y = (Tensor.from_numpy("y", np.arange(3, dtype=np.int32)),)
    first = InferResult("a", "m", "1", y, index=0, final=False)
    second = InferResult("a", "m", "1", y, index=1, final=False)
    closing = InferResult("a", "m", "1", index=2, empty=True)
    back = decode_results(encode_results([first, second, closing]))
    assert [(r.index, r.final, r.empty) for r in back] == [(0, False, False), (1, False, False),
                                                           (2, True, True)]  # fmt: skip
    assert back[1].output("y").to_numpy().tolist() == [0, 1, 2] and back[2].outputs == ()
    # an ordinary answer's map is what it was before decoupled models: no new keys
    plain = msgpack.unpackb(encode_result(InferResult("b", "m", "1", y)))
    assert not {"index", "final", "empty"} & set(plain)


def test_a_results_parameters_travel_and_a_result_without_them_keeps_its_bytes() -> None:
    y = (Tensor.from_numpy("y", np.array([[7]], np.int32)),)
    params = {"a": 1, "b": "x", "c": True, "f": 0.25, "neg": -(2**63), "big": 2**63 - 1}
    given = InferResult("a", "m", "1", y, parameters=params, index=2, final=False)
    back = decode_result(encode_result(given))
    assert back.parameters == params and type(back.parameters["c"]) is bool
    assert (back.index, back.final) == (2, False) and back.output("y").to_numpy().tolist() == [[7]]
    assert msgpack.unpackb(encode_result(given))["parameters"] == params  # a plain map
    both = decode_results(encode_results([given, InferResult("b", "m", "1", y)]))
    assert [dict(r.parameters) for r in both] == [params, {}]
    # Without parameters a result's map is byte for byte what it was before they existed:
    # no key, not even an empty map (every answer of every model is written this way).
    plain = InferResult("b", "m", "1", y, timing_us={"queue": 3}, worker="w")
    assert encode_result(plain) == msgpack.packb(
        {
            "v": 1, "id": "b", "model": "m", "version": "1", "status": "ok",
            "outputs": [{"name": "y", "datatype": "INT32", "shape": [1, 1],
                         "data": np.array([[7]], np.int32).tobytes()}],
            "timing_us": {"queue": 3}, "worker": "w",
        },
        use_bin_type=True,
    )  # fmt: skip
    assert InferResult("b", "m", "1", parameters={}).parameters == {}
    assert encode_result(InferResult("b", "m", "1", parameters={})) == encode_result(
        InferResult("b", "m", "1")
    )
    assert decode_result(encode_result(plain)).parameters is NO_PARAMETERS  # no dict of its own


@pytest.mark.parametrize(
    "params",
    [[1, 2], {"l": [1]}, {"n": None}, {"m": {"k": 1}}, {"u": 2**63}, {"b": b"raw"}],
)
def test_bad_result_parameters_are_a_codec_error(params: Any) -> None:
    body = msgpack.unpackb(encode_result(InferResult("a", "m", "1")))
    with pytest.raises(CodecError, match="parameter"):
        decode_result(msgpack.packb({**body, "parameters": params}, use_bin_type=True))


@pytest.mark.parametrize(
    ("extra", "text"),
    [({"index": -1}, "index"), ({"index": "2"}, "index"), ({"final": 0}, "final"),
     ({"empty": True, "final": False}, "empty result must be final")],
)  # fmt: skip
def test_a_bad_response_marker_is_a_codec_error(extra: dict[str, Any], text: str) -> None:
    body = msgpack.unpackb(encode_result(InferResult("a", "m", "1")))
    with pytest.raises(CodecError, match=text):
        decode_result(msgpack.packb({**body, **extra}))


def test_a_result_batch_is_result_maps_back_to_back() -> None:
    results = [InferResult(f"r{i}", "m", "1", error=ErrorInfo("timeout", "late")) for i in range(3)]
    batch = encode_results(results)
    assert batch == join_results([encode_result(r) for r in results])  # what the writer sends
    plain = msgpack.Unpacker(raw=False)  # any msgpack stream reader can take it apart
    plain.feed(batch)
    assert [m["id"] for m in plain] == ["r0", "r1", "r2"]
    assert [r.id for r in decode_results(memoryview(batch))] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("damage", [lambda b: b[:-2], lambda b: b"\xc1" + b, lambda b: b + b"\x92"])
def test_a_damaged_result_batch_is_a_codec_error(damage) -> None:
    batch = encode_results([InferResult("a", "m", "1", error=ErrorInfo("timeout", "late"))])
    with pytest.raises(CodecError):
        decode_results(damage(batch))


def _envelope(**fields) -> bytes:
    base = {
        "v": 1,
        "id": "x",
        "model": "m",
        "version": "",
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": b"\0" * 4}],
    }
    base.update(fields)
    return msgpack.packb({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize(
    ("data", "error", "text"),
    [
        (b"\xc1not msgpack", CodecError, "not valid msgpack"),
        (msgpack.packb([1, 2]), CodecError, "must be a msgpack map"),
        (_envelope(v=2), UnsupportedVersion, "version 2"),
        (_envelope(v=...), UnsupportedVersion, "version None"),
        (_envelope(id=...), CodecError, "correlation id"),
        (_envelope(id=""), CodecError, "correlation id"),
        (_envelope(model=...), CodecError, "model name"),
        (_envelope(version=3), CodecError, "'version' must be a string"),
        (_envelope(inputs={"a": 1}), CodecError, "'inputs' must be a list"),
        (_envelope(inputs=[7]), CodecError, "must be a map"),
        (
            _envelope(inputs=[{"name": "a", "datatype": "FP99", "shape": [1], "data": b""}]),
            CodecError,
            "unknown datatype",
        ),
        (
            _envelope(inputs=[{"name": "a", "datatype": "FP32", "shape": [-1], "data": b""}]),
            CodecError,
            "non-negative",
        ),
        (
            _envelope(inputs=[{"name": "a", "datatype": "FP32", "shape": [1], "data": "text"}]),
            CodecError,
            "must be bytes",
        ),
        (
            _envelope(inputs=[{"datatype": "FP32", "shape": [1], "data": b""}]),
            CodecError,
            "name must be",
        ),
        (_envelope(outputs="y"), CodecError, "'outputs' must be a list"),
        (_envelope(deadline_ms="soon"), CodecError, "'deadline_ms' must be an integer"),
        (_envelope(priority=True), CodecError, "'priority' must be an integer"),
        (_envelope(sent_us=1.5), CodecError, "'sent_us' must be an integer"),
        (_envelope(reply_stream=""), CodecError, "reply_stream"),
        (_envelope(parameters=[1]), CodecError, "'parameters' must be a map"),
        (_envelope(parameters={b"raw": 1}), CodecError, r"parameter b'raw': a name must be"),
        (_envelope(classification={"y": 0}), CodecError, "'classification' must map"),
        (_envelope(classification={"y": True}), CodecError, "'classification' must map"),
        (_envelope(classification=["y"]), CodecError, "'classification' must map"),
    ],
)
def test_malformed_envelopes(data: bytes, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text) as info:
        decode_request(data)
    assert info.value.code in ("bad_envelope", "unsupported_envelope_version")


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": None, "created_ms": None, "sent_us": None},  # nil for "use the default"
        {"outputs": []},
        {"inputs": [{"name": "a", "datatype": "FP32", "shape": (1,), "data": b"\0" * 4}]},
        {"extra": {"unknown": "fields are ignored"}},
    ],
)
def test_what_only_the_typed_decoder_refuses_is_decided_by_the_checked_one(
    fields: dict[str, Any],
) -> None:
    data = _envelope(**fields)
    req = decode_request(data)
    assert req == _decode_checked(data)
    assert (req.id, req.priority, req.created_ms, req.sent_us) == ("x", 0, 0, 0)


def _outcome(data: bytes) -> object:
    try:
        return _decode_checked(data)
    except CodecError as exc:
        return type(exc), str(exc)


_ENVELOPE_FIELDS = _WireRequest.__struct_fields__
_ANY_VALUE = (
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3) | st.binary(max_size=4)
)


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(_ENVELOPE_FIELDS),
    value=_ANY_VALUE
    | st.lists(_ANY_VALUE, max_size=2)
    | st.dictionaries(st.text(max_size=2), _ANY_VALUE, max_size=2),
)
def test_the_typed_decoder_never_decides_otherwise_than_the_checked_one(
    field: str, value: object
) -> None:
    data = _envelope(**{field: value})
    try:
        decoded: object = decode_request(data)
    except CodecError as exc:
        decoded = type(exc), str(exc)
    assert decoded == _outcome(data)


def test_the_typed_decoder_knows_every_datatype() -> None:
    assert set(get_args(_Datatype)) == DATATYPES


def test_the_encoder_writes_what_msgpack_writes() -> None:
    tensor = Tensor.from_numpy("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    request = InferRequest(
        "r", "m", "2", (tensor,), ("y",), ReplyTo("s"), 10**13, 2, {"f": 0.5, "b": True}, 1, 2
    )
    old = {"use_bin_type": True}
    body = msgpack.unpackb(encode_request(request))
    assert encode_request(request) == msgpack.packb(body, **old)
    results = [
        InferResult("a", "m", "1", (tensor,), timing_us={"queue": 2**40}, worker="w"),
        InferResult("b", "m", "1", error=ErrorInfo("bad", "no")),
        InferResult("c", "m", "1", (tensor,), parameters={"a": 1, "b": "x", "c": True}),
    ]
    for result in results:
        assert encode_result(result) == msgpack.packb(_result_to_map(result), **old)
    assert _ENCODER.encode({"neg": -(2**40), "u": 2**64 - 1}) == msgpack.packb(
        {"neg": -(2**40), "u": 2**64 - 1}, **old
    )


def test_tensor_byte_length_mismatch_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="expected 8"):
        Tensor("x", "FP32", (2,), b"\0" * 7).to_numpy()


def test_classification_counts_travel_and_are_absent_when_none_asked() -> None:
    req = decode_request(_envelope(classification={"y": 3}))
    assert req.classification == {"y": 3}
    assert decode_request(encode_request(req)).classification == {"y": 3}
    plain = decode_request(_envelope())
    assert plain.classification == {}
    assert b"classification" not in encode_request(plain)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_an_empty_tensor_travels(dtype: type) -> None:
    empty = np.zeros((1, 0), dtype)  # a request whose variable dimension is 0
    back = decode_request(
        encode_request(InferRequest("e", "m", "", (Tensor.from_numpy("x", empty),)))
    )
    out = back.inputs[0].to_numpy()
    assert out.shape == (1, 0) and out.dtype == dtype


def test_correlation_ids_are_32_hex_digits_and_do_not_repeat() -> None:
    ids = [new_correlation_id() for _ in range(1000)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)


def test_key_partition_is_stable_in_range_and_spreads() -> None:
    every = [0, 1, 2, 3]
    keys = [f"request-{i}".encode() for i in range(200)]
    placed = [key_partition(k, every, every) for k in keys]
    assert placed == [key_partition(k, every, every) for k in keys]  # the same key, the same place
    assert set(placed) == set(every)
    assert key_partition(None, every, [2]) == 2  # unkeyed: an available one


_RESULT = InferResult(
    "a",
    "m",
    "1",
    (Tensor.from_numpy("y", np.arange(4, dtype=np.float32)),),
    timing_us={"queue": 5},
    worker="w",
    trace_ns={"QUEUE_START": 7},
    parameters={"p": 1},
)
_RESULT_FIELDS = (*_WireResult.__struct_fields__, "extra")
_RESULT_VALUE = _ANY_VALUE | st.floats(allow_nan=False) | st.sampled_from(["ok", "error"])


def _checked_result(data: bytes) -> object:
    """What the map-by-map path makes of one result map: the result, or its exception."""
    try:
        return _result_from_map(msgpack.unpackb(data, raw=False))
    except Exception as exc:
        return type(exc), str(exc)


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(_RESULT_FIELDS),
    value=_RESULT_VALUE
    | st.lists(_RESULT_VALUE, max_size=2)
    | st.dictionaries(st.text(max_size=2), _RESULT_VALUE, max_size=2),
)
def test_the_typed_result_decoder_never_decides_otherwise_than_the_checked_one(
    field: str, value: object
) -> None:
    """A result map with any one field replaced decodes as the map-by-map path decodes
    it, alone (``decode_result``) and in a batch read with its count (``decode_results``)."""
    _assert_the_decoders_agree({field: value})


@pytest.mark.parametrize(
    "fields",
    [
        {"index": -1}, {"index": True}, {"index": 3}, {"final": 0}, {"final": False},
        {"empty": True, "final": False}, {"empty": True, "outputs": []}, {"v": 2}, {"v": True},
        {"status": "error"}, {"status": "error", "error": {"code": "timeout"}},
        {"status": "error", "error": {"code": 3}}, {"error": {"code": "x"}}, {"id": 5},
        {"timing_us": {"q": 1.5}}, {"trace_ns": {"A": -1}}, {"parameters": {"u": 2**63}},
        {"parameters": None}, {"parameters": {}}, {"outputs": None}, {"worker": None},
        {"outputs": [{"name": "", "datatype": "FP32", "shape": [1], "data": b"\0" * 4}]},
        {"outputs": [{"name": "y", "datatype": "FP32", "shape": [True], "data": b"\0" * 4}]},
        {"outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": "text"}]},
    ],
)  # fmt: skip
def test_the_result_decoders_agree_on_each_check(fields: dict[str, Any]) -> None:
    _assert_the_decoders_agree(fields)


def _assert_the_decoders_agree(fields: dict[str, Any]) -> None:
    body = msgpack.unpackb(encode_result(_RESULT), raw=False)
    data = msgpack.packb({**body, **fields}, use_bin_type=True)
    expected = _checked_result(data)
    for decode in (decode_result, lambda d: decode_results(d + d, 2)[1]):
        try:
            got: object = decode(data)
        except Exception as exc:
            got = type(exc), str(exc)
        if isinstance(expected, tuple) and not issubclass(expected[0], CodecError):
            # a check the map reader does not name itself: both readers call it a CodecError
            assert isinstance(got, tuple) and got[0] is CodecError
        else:
            assert got == expected


@pytest.mark.parametrize("wrong", [None, 0, 1, 2, 4, 70_000])
def test_a_result_batch_read_with_a_wrong_or_no_count_is_read_map_by_map(wrong: int) -> None:
    results = [_RESULT, InferResult("b", "m", "1", error=ErrorInfo("timeout", "late")), _RESULT]
    batch = encode_results(results)
    assert decode_results(batch, 3) == decode_results(batch, wrong) == results


def test_a_damaged_result_batch_is_a_codec_error_with_its_count_too() -> None:
    batch = encode_results([_RESULT, _RESULT])
    for damaged in (batch[:-2], b"\xc1" + batch, batch + b"\x92"):
        with pytest.raises(CodecError):
            decode_results(damaged, 2)


def test_a_result_batch_with_a_count_past_the_array_form_is_read_map_by_map() -> None:
    data = encode_results([_RESULT])
    assert decode_results(data, entry_count(b"4294967296")) == [_RESULT]


def test_a_long_result_batch_reads_with_its_count() -> None:
    results = [msgspec.structs.replace(_RESULT, id=f"r{i}") for i in range(70)]
    assert decode_results(encode_results(results), 70) == results


@pytest.mark.parametrize(
    ("field", "count"),
    [
        (b"3", 3),
        ("12", 12),
        (None, None),
        (b"x", None),
        (b"0", None),
        (b"4294967295", 4294967295),  # the most a msgpack array header announces
        (b"4294967296", None),  # more: read map by map, never an OverflowError
    ],
)
def test_an_entrys_count_field(field: bytes | str | None, count: int | None) -> None:
    assert entry_count(field) == count
