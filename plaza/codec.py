"""msgpack encoding of requests and results; the only module that knows the wire layout.

Maps use short string keys (see docs/protocol.md). Tensor data travels as msgpack ``bin``
and is decoded zero-copy: ``Tensor.data`` is a memoryview into the received message.

A request is decoded twice over, in the common case only once: msgspec's typed decoder
(``_WireRequest``: its types and constraints are the protocol's checks) takes every envelope
first, and whatever it refuses goes to ``_decode_checked``, the checks written out in
Python, which either accepts it (a few encodings the typed one is stricter about, such as
an explicit nil priority) or raises the CodecError that names what is wrong. The typed
decoder is a speed-up, never the judge: what the checked one accepts is the protocol.

Results are read the same way (``_WireResult``, then ``_result_from_map``). A reply stream
entry holds its results back to back with their count beside them (``n``), so the typed
decoder reads the batch as one array behind an array header made from that count; a wrong
count is only a batch the typed decoder refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeGuard

import msgpack
import msgspec

from plaza.contract import (
    ENVELOPE_VERSION,
    INT64_MAX,
    INT64_MIN,
    NO_PARAMETERS,
    ErrorInfo,
    InferRequest,
    InferResult,
    ReplyTo,
    Scalar,
)
from plaza.datatypes import DATATYPES
from plaza.errors import CodecError, UnsupportedVersion
from plaza.tensors import Buffer, Tensor

_ENCODER = msgspec.msgpack.Encoder()
"""Writes the bytes ``msgpack.packb(..., use_bin_type=True)`` writes for the same maps
(tests/unit/test_codec.py holds it to that), in about a third of the time."""


def _tensor_to_map(t: Tensor) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "data": t.data}


def _is_dims(shape: Any) -> TypeGuard[list[int] | tuple[int, ...]]:
    """A list (or tuple) of non-negative ints, bools refused (``type(d) is int`` first:
    the common case, which bool fails)."""
    if not isinstance(shape, list | tuple):
        return False
    for d in shape:
        if type(d) is not int and (not isinstance(d, int) or isinstance(d, bool)):
            return False
        if d < 0:
            return False
    return True


def _tensor_from_map(m: Any, kind: str, index: int) -> Tensor:
    """One tensor map; CodecError naming it (``input 0``) when malformed. The checks run
    for every tensor of every request, so the message is only formatted on failure."""
    if not isinstance(m, Mapping):
        raise CodecError(f"{kind} {index}: a tensor must be a map")
    get = m.get
    name, datatype, shape, data = get("name"), get("datatype"), get("shape"), get("data")
    if not isinstance(name, str) or not name:
        raise CodecError(f"{kind} {index}: tensor name must be a non-empty string")
    if datatype not in DATATYPES:
        raise CodecError(f"{kind} {index}: tensor {name!r} has unknown datatype {datatype!r}")
    if not _is_dims(shape):
        raise CodecError(
            f"{kind} {index}: tensor {name!r} shape must be a list of non-negative ints"
        )
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"{kind} {index}: tensor {name!r} data must be bytes (msgpack bin)")
    return Tensor(name, datatype, tuple(shape), data)


def encode_request(req: InferRequest, *, sent_us: int | None = None) -> bytes:
    """The request as a msgpack map (envelope version ENVELOPE_VERSION); ``sent_us``
    stamps the moment of publishing in place of ``req.sent_us``."""
    body: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "id": req.id,
        "model": req.model,
        "version": req.version,
        "inputs": [_tensor_to_map(t) for t in req.inputs],
    }
    if req.outputs:
        body["outputs"] = list(req.outputs)
    if req.classification:
        body["classification"] = req.classification
    if req.reply.stream:
        body["reply_stream"] = req.reply.stream
    if req.deadline_ms is not None:
        body["deadline_ms"] = req.deadline_ms
    if req.priority:
        body["priority"] = req.priority
    if req.parameters:
        body["parameters"] = req.parameters
    if req.created_ms:
        body["created_ms"] = req.created_ms
    if req.trace:
        body["trace"] = True
    sent = req.sent_us if sent_us is None else sent_us
    if sent:
        body["sent_us"] = sent
    return _ENCODER.encode(body)


def _unpack_map(data: Buffer, what: str) -> Mapping[str, Any]:
    try:
        body = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except msgpack.StackError as exc:
        raise CodecError(f"{what} nests maps or arrays too deep to be read") from exc
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"{what} is not valid msgpack: {exc}") from exc
    if not isinstance(body, Mapping):
        raise CodecError(f"{what} must be a msgpack map, got {type(body).__name__}")
    version = body.get("v")
    if version != ENVELOPE_VERSION:
        raise UnsupportedVersion(
            f"{what} version {version!r} is not supported (this build speaks {ENVELOPE_VERSION})"
        )
    return body


_PEEKED = ("id", "reply_stream")


def peek_reply(data: Buffer) -> tuple[str | None, str | None]:
    """Correlation id and reply stream of an envelope that failed full decoding, where they
    can be read at all (so its error can still be answered); never raises.

    Lenient where decoding is strict, since docs/protocol.md dead-letters only a record that
    is not msgpack or has no id: the first msgpack object is read (bytes after it are left),
    a map entry by entry, keys of any type, the other values skipped unread; a value nested
    deeper than the reader goes (valid msgpack all the same) keeps what was read before it.
    Only the failure path pays for this."""
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=False, max_buffer_size=max(memoryview(data).nbytes, 1)
    )
    found: dict[str, Any] = {}
    try:
        unpacker.feed(data)
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if isinstance(key, str) and key in _PEEKED:
                found[key] = unpacker.unpack()  # a repeated key: the last wins, as unpackb's
            else:
                unpacker.skip()
    except (msgpack.StackError, RecursionError):
        pass  # nested past the reader's depth
    except Exception:  # not msgpack (truncated, a reserved byte), not a map, MemoryError
        return None, None
    rid, stream = found.get("id"), found.get("reply_stream")
    return (
        rid if isinstance(rid, str) and rid else None,
        stream if isinstance(stream, str) and stream else None,
    )


def _opt_int(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise CodecError(f"request field {key!r} must be an integer")
    return value


_NO_REPLY = ReplyTo()
_NO_OUTPUTS: tuple[str, ...] = ()
_NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})


_Name = Annotated[str, msgspec.Meta(min_length=1)]
_Dim = Annotated[int, msgspec.Meta(ge=0)]
_Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip


class _WireTensor(msgspec.Struct):
    """A tensor map as the typed decoder reads it (the checks of ``_tensor_from_map``)."""

    name: _Name
    datatype: _Datatype
    shape: tuple[_Dim, ...]
    data: memoryview


class _WireRequest(msgspec.Struct):
    """A request envelope as the typed decoder reads it: the protocol's common case."""

    v: int
    id: _Name
    model: _Name
    inputs: tuple[_WireTensor, ...]
    version: str = ""
    outputs: tuple[str, ...] = ()
    reply_stream: _Name | None = None
    deadline_ms: int | None = None
    priority: int = 0
    parameters: dict[str, bool | int | float | str] = {}
    created_ms: int = 0
    sent_us: int = 0
    classification: dict[_Name, Annotated[int, msgspec.Meta(ge=1)]] = {}
    trace: bool = False


_REQUEST_DECODER = msgspec.msgpack.Decoder(_WireRequest)


def decode_request(data: Buffer) -> InferRequest:
    """Parse a request envelope; CodecError (with a stable code) for anything malformed."""
    try:
        wire = _REQUEST_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        # (msgspec's depth limit is a RecursionError: the checked decoder names it)
        return _decode_checked(data)
    if wire.v != ENVELOPE_VERSION:
        return _decode_checked(data)  # raises UnsupportedVersion
    stream = wire.reply_stream
    return InferRequest(
        id=wire.id,
        model=wire.model,
        version=wire.version,
        inputs=tuple([Tensor(t.name, t.datatype, t.shape, t.data) for t in wire.inputs]),
        outputs=wire.outputs,
        reply=_NO_REPLY if stream is None else ReplyTo(stream=stream),
        deadline_ms=wire.deadline_ms,
        priority=wire.priority,
        parameters=wire.parameters,
        created_ms=wire.created_ms,
        sent_us=wire.sent_us,
        classification=wire.classification,
        trace=wire.trace,
    )


def _decode_checked(data: Buffer) -> InferRequest:
    """``decode_request`` with every check written out: the envelopes the typed decoder
    refuses come here, to be accepted after all or refused with a CodecError naming why."""
    body = _unpack_map(data, "request")
    get = body.get
    rid, model, version = get("id"), get("model"), get("version", "")
    if not isinstance(rid, str) or not rid:
        raise CodecError("request has no correlation id ('id')")
    if not isinstance(model, str) or not model:
        raise CodecError("request has no model name ('model')")
    if not isinstance(version, str):
        raise CodecError("request 'version' must be a string")
    inputs = get("inputs")
    if not isinstance(inputs, list):
        raise CodecError("request 'inputs' must be a list of tensors")
    outputs = get("outputs", _NO_OUTPUTS)
    if outputs is _NO_OUTPUTS or outputs == []:
        wanted = _NO_OUTPUTS
    elif isinstance(outputs, list) and all(isinstance(o, str) for o in outputs):
        wanted = tuple(outputs)
    else:
        raise CodecError("request 'outputs' must be a list of names")
    stream = get("reply_stream")
    if stream is not None and (not isinstance(stream, str) or not stream):
        raise CodecError("request 'reply_stream' must be a non-empty string")
    params = get("parameters", _NO_PARAMETERS)
    if params is not _NO_PARAMETERS:
        _check_parameters(params)
    # The optional integers: absent is the common case, and costs one lookup each.
    deadline = _opt_int(body, "deadline_ms", None) if "deadline_ms" in body else None
    priority = _opt_int(body, "priority", 0) if "priority" in body else 0
    created = _opt_int(body, "created_ms", 0) if "created_ms" in body else 0
    sent = _opt_int(body, "sent_us", 0) if "sent_us" in body else 0
    classes = get("classification", _NO_PARAMETERS)
    if not isinstance(classes, Mapping) or not all(
        isinstance(k, str) and k and type(n) is int and n >= 1 for k, n in classes.items()
    ):
        raise CodecError("request 'classification' must map output names to counts >= 1")
    trace = get("trace", False)
    if not isinstance(trace, bool):
        raise CodecError("request 'trace' must be true or false")
    return InferRequest(
        id=rid,
        model=model,
        version=version,
        inputs=tuple([_tensor_from_map(t, "input", i) for i, t in enumerate(inputs)]),
        outputs=wanted,
        reply=_NO_REPLY if stream is None else ReplyTo(stream=stream),
        deadline_ms=deadline,
        priority=priority or 0,
        parameters=dict(params) if params else {},
        created_ms=created or 0,
        sent_us=sent or 0,
        classification=dict(classes),
        trace=trace,
    )


def _check_parameters(params: Any) -> None:
    """A request's ``parameters``: names (str) to scalars (bool, int, float, str), what
    Triton's parameters hold and what both fronts pass on; CodecError naming the first
    parameter that is not (bin, nil, a map, a list, an ext, a non-string name)."""
    if not isinstance(params, Mapping):
        raise CodecError("request 'parameters' must be a map")
    for key, value in params.items():
        if not isinstance(key, str):
            raise CodecError(f"request parameter {_shown(key)}: a name must be a string")
        if not isinstance(value, str | int | float):  # bool is an int
            raise CodecError(
                f"request parameter {_shown(key)}: a value must be a bool, an int, a float or "
                f"a string, not {type(value).__name__}"
            )


def _shown(value: Any) -> str:
    """``repr(value)``, cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}..."


def _result_to_map(res: InferResult) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "id": res.id,
        "model": res.model,
        "version": res.version,
        "status": res.status,
    }
    if res.error:
        body["error"] = {"code": res.error.code, "message": res.error.message}
    else:
        body["outputs"] = [_tensor_to_map(t) for t in res.outputs]
    if res.timing_us:
        body["timing_us"] = res.timing_us
    if res.worker:
        body["worker"] = res.worker
    if res.trace_ns:
        body["trace_ns"] = res.trace_ns
    if res.index:
        body["index"] = res.index
    if not res.final:
        body["final"] = False
    if res.empty:
        body["empty"] = True
    if res.parameters:  # absent, the common case: a result's map is no larger for them
        body["parameters"] = dict(res.parameters)
    return body


def encode_result(res: InferResult) -> bytes:
    """One result as a msgpack map."""
    return _ENCODER.encode(_result_to_map(res))


def join_results(encoded: Sequence[bytes]) -> bytes:
    """A result batch from results already encoded with ``encode_result``.

    The results wire format of a reply stream entry: the result maps back to back, a msgpack
    stream with no array header (the entry's ``n`` field counts them). Joining is all there
    is to it, so the writer encodes each result once in Python (that one payload also goes
    under the result key) and its Lua script joins the first-write winners with
    ``table.concat``; it knows nothing else of msgpack.
    """
    return b"".join(encoded)


def encode_results(results: Sequence[InferResult]) -> bytes:
    """Several results as one result batch (what one reply stream entry's ``r`` holds)."""
    return join_results([encode_result(r) for r in results])


def _result_from_map(body: Any) -> InferResult:
    if not isinstance(body, Mapping) or body.get("v") != ENVELOPE_VERSION:
        raise CodecError("result entry is not a version-1 map")
    err = body.get("error")
    error = None
    if body.get("status") == "error":
        if not isinstance(err, Mapping):
            raise CodecError("error result without an 'error' map")
        error = ErrorInfo(str(err.get("code", "internal")), str(err.get("message", "")))
    outputs = tuple(_tensor_from_map(t, "output", i) for i, t in enumerate(body.get("outputs", [])))
    index, final, empty = body.get("index", 0), body.get("final", True), body.get("empty", False)
    if type(index) is not int or index < 0:
        raise CodecError(f"result index must be a non-negative int, not {index!r}")
    if type(final) is not bool or type(empty) is not bool:
        raise CodecError("result 'final' and 'empty' must be booleans")
    if empty and not final:
        raise CodecError("an empty result must be final")
    params = body.get("parameters")
    return InferResult(
        id=str(body.get("id", "")),
        model=str(body.get("model", "")),
        version=str(body.get("version", "")),
        outputs=outputs,
        error=error,
        timing_us=dict(body.get("timing_us", {})),
        worker=str(body.get("worker", "")),
        trace_ns=dict(body.get("trace_ns", {})),
        index=index,
        final=final,
        empty=empty,
        parameters=NO_PARAMETERS if params is None else _result_parameters(params),
    )


def _result_parameters(value: Any) -> dict[str, Scalar]:
    """A result's ``parameters``: names to bool, str, float or 64-bit signed int values
    (what both fronts can send back: gRPC's ``InferParameter`` has no other kinds)."""
    if not isinstance(value, Mapping):
        raise CodecError("result 'parameters' must be a map")
    for key, v in value.items():
        if not isinstance(key, str) or not (
            isinstance(v, bool | str | float)
            or (isinstance(v, int) and INT64_MIN <= v <= INT64_MAX)
        ):
            raise CodecError(
                f"result parameter {key!r}: a value must be a bool, a 64-bit int, a float or "
                f"a string, not {v!r}"
            )
    return dict(value)


class _WireError(msgspec.Struct):
    code: str = "internal"
    message: str = ""


class _WireResult(msgspec.Struct):
    """A result map as the typed decoder reads it (the checks of ``_result_from_map``,
    with ``_result_from_wire`` for those between fields)."""

    v: int
    id: str = ""
    model: str = ""
    version: str = ""
    status: str = ""
    error: _WireError | None = None
    outputs: tuple[_WireTensor, ...] = ()
    timing_us: dict[str, int] = {}
    worker: str = ""
    trace_ns: dict[str, int] = {}
    index: Annotated[int, msgspec.Meta(ge=0)] = 0
    final: bool = True
    empty: bool = False
    parameters: dict[str, Any] | None = None


_RESULT_DECODER = msgspec.msgpack.Decoder(_WireResult)
_RESULTS_DECODER = msgspec.msgpack.Decoder(list[_WireResult])


def _result_from_wire(wire: _WireResult) -> InferResult | None:
    """The result the typed decoder read; None where ``_result_from_map`` must judge (it
    raises the CodecError that names what is wrong)."""
    if wire.v != ENVELOPE_VERSION or (wire.empty and not wire.final):
        return None
    error = None
    if wire.status == "error":
        if wire.error is None:
            return None
        error = ErrorInfo(wire.error.code, wire.error.message)
    params = wire.parameters
    return InferResult(
        id=wire.id,
        model=wire.model,
        version=wire.version,
        outputs=tuple([Tensor(t.name, t.datatype, t.shape, t.data) for t in wire.outputs]),
        error=error,
        timing_us=wire.timing_us,
        worker=wire.worker,
        trace_ns=wire.trace_ns,
        index=wire.index,
        final=wire.final,
        empty=wire.empty,
        parameters=NO_PARAMETERS if params is None else _result_parameters(params),
    )


def decode_result(data: Buffer) -> InferResult:
    """Parse one result map (as stored under a result key)."""
    try:
        result = _result_from_wire(_RESULT_DECODER.decode(data))
    except (msgspec.ValidationError, msgspec.DecodeError):
        result = None
    if result is not None:
        return result
    try:
        body = msgpack.unpackb(data, raw=False)
    except Exception as exc:
        raise CodecError(f"result is not valid msgpack: {exc}") from exc
    try:
        return _result_from_map(body)
    except CodecError:
        raise
    except Exception as exc:  # a field of the wrong type that the checks did not name
        raise CodecError(f"result is not a valid result map: {exc!r}") from exc


_MAX_ENTRY_COUNT = 0xFFFFFFFF
"""The most items a msgpack array header can announce (its array 32 form)."""


def entry_count(value: bytes | str | None) -> int | None:
    """A stream entry's ``n`` field (how many results its ``r`` holds) as ``decode_results``
    takes it; None where it is missing or not a count (the results are read without it)."""
    if value is None:
        return None
    try:
        count = int(value)
    except ValueError:
        return None
    return count if 0 < count <= _MAX_ENTRY_COUNT else None


def _array_header(count: int) -> bytes:
    """msgpack's header of an array of ``count`` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def decode_results(data: Buffer, count: int | None = None) -> list[InferResult]:
    """Parse a result batch (a stream entry's ``r``: result maps back to back).

    With ``count`` (the entry's ``n``) the batch is read as one array by the typed decoder,
    about a quarter of the cost a result; a batch it refuses, or a wrong count, is read map
    by map with every check written out, which accepts it or names what is wrong."""
    if count:
        typed = _typed_results(data, count)
        if typed is not None:
            return typed
    size = memoryview(data).nbytes
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(size, 1))
    results: list[InferResult] = []
    end = 0  # where the last whole map ended: a partial one is not an error to the Unpacker
    try:
        unpacker.feed(data)
        for body in unpacker:
            results.append(_result_from_map(body))
            end = unpacker.tell()
    except CodecError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"result batch is not valid msgpack: {exc!r}") from exc
    if end != size:
        raise CodecError(f"result batch is truncated: {size - end} bytes after the last result")
    return results


def _typed_results(data: Buffer, count: int) -> list[InferResult] | None:
    try:
        wires = _RESULTS_DECODER.decode(b"".join([_array_header(count), data]))
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    results: list[InferResult] = []
    for wire in wires:
        result = _result_from_wire(wire)
        if result is None:
            return None
        results.append(result)
    return results
