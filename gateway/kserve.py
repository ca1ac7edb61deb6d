"""KServe v2 / Triton HTTP bodies <-> Plaza tensors: the gateway's only wire-format module.

Requests are JSON (``{"inputs": [...], "outputs": [...], "id", "parameters"}``), optionally
with Triton's binary tensor extension: an ``Inference-Header-Content-Length: N`` header says
the first N bytes are the JSON header and the raw tensor bytes follow, in input order, for
every input whose ``parameters.binary_data_size`` is set. Binary data is decoded zero-copy
(a memoryview into the body, read later with ``numpy.frombuffer``); JSON data goes through
numpy in one vectorised conversion (a flat list of floats through ``struct``, cheaper
still). Anything malformed raises ``InvalidInput``.

Responses use binary for outputs that ask for it (``parameters.binary_data``, or the
request's ``binary_data_output``) and JSON data otherwise.

As Triton's JSON (rapidjson with its NaN and Inf flags), float data may hold the tokens
``NaN``, ``Infinity`` and ``-Infinity``, both ways: a body orjson refuses for one of them
is read again by the stdlib's parser, and a float output that holds one is written with
them (orjson would write null, which a client reads as NaN). Generate's bodies
(``plaza.gateway.generate``) are read and written by the same two functions
(``load_json_object``, ``non_finite_json``).

Triton's system shared memory extension (``plaza.gateway.shared_memory``): an input whose
parameters name a registered region is read from it, and an output requested into one is
checked against it as the request is decoded, written there and answered without data.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import orjson

from plaza.contract import InferRequest, InferResult, Scalar
from plaza.datatypes import DATATYPES, itemsize, to_numpy_dtype
from plaza.errors import InvalidInput, PayloadTooLarge
from plaza.gateway.requests import FrontRequest, output_classes, refuse_unsupported
from plaza.gateway.shared_memory import (
    SHM_PARAMS,
    SharedMemoryRegions,
    ShmRef,
    shm_ref,
)
from plaza.modelconfig import ModelSpec, TensorSpec
from plaza.tensors import Buffer, Tensor, serialize_bytes

HEADER_INFERENCE_LENGTH = "Inference-Header-Content-Length"
"""Triton's binary tensor extension header, on requests and responses (case-insensitive)."""
CONTENT_TYPE_JSON = "application/json"
CONTENT_TYPE_BINARY = "application/octet-stream"

# Request parameters the gateway consumes itself; the rest travel to the worker.
_PARAM_BINARY_OUTPUT = "binary_data_output"
_CONSUMED_PARAMS = frozenset({_PARAM_BINARY_OUTPUT})
"""Request parameters only the HTTP front consumes (timeout, priority: gateway.requests)."""

_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY
MAX_NESTING = 64
"""Deepest nesting of an input's JSON ``data`` (numpy's own limit on dimensions)."""
_END = object()
_INT_KINDS = "iu"
_FLOAT_KINDS = "iuf"
_PACK_CODES = {"FP16": "e", "FP32": "f", "FP64": "d"}
"""``struct``'s little-endian codes of the float datatypes (each rounds a double to nearest)."""
_NON_FINITE_TOKENS = ("NaN", "Infinity", "-Infinity")
"""JSON's non-finite float values as Triton reads and writes them (rapidjson's NaN/Inf flags)."""
_NON_FINITE_OUT = (b"NaN", b"Infinity", b"-Infinity")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1
"""The integers orjson reads as integers; it reads a literal past them as a float."""


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One entry of the request's ``outputs`` list."""

    name: str
    binary: bool | None = None
    """``parameters.binary_data``; None follows the request's ``binary_data_output``."""
    classes: int | None = None
    """``parameters.classification``: its top classes in place of its values."""
    shm: ShmRef | None = None
    """Where in a registered shared memory region to write it (None: in the response)."""


@dataclass(frozen=True, slots=True)
class InferBody:
    """A decoded infer request body: the request, and how the response should look."""

    request: FrontRequest
    outputs: tuple[RequestedOutput, ...] = ()
    client_id: str | None = None
    """The request's ``id``: the client's label, echoed in the response."""
    binary_output: bool = False
    """``parameters.binary_data_output``: the default for outputs that do not say."""

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.request.inputs

    @property
    def timeout_us(self) -> int | None:
        return self.request.timeout_us

    def wants_binary(self, name: str) -> bool:
        for out in self.outputs:
            if out.name == name and out.binary is not None:
                return out.binary
        return self.binary_output

    def shm_of(self, name: str) -> ShmRef | None:
        """Where output ``name`` goes in shared memory (None: in the response)."""
        for out in self.outputs:
            if out.name == name:
                return out.shm
        return None

    @property
    def uses_shm_outputs(self) -> bool:
        return any(out.shm is not None for out in self.outputs)

    def to_request(self, model: str, version: str, correlation_id: str) -> InferRequest:
        """The Plaza request (``FrontRequest.to_request``)."""
        return self.request.to_request(model, version, correlation_id)


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body and what its HTTP headers must say."""

    content: bytes
    header_length: int | None = None
    """Length of the JSON header when binary tensors follow it, else None."""

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_JSON if self.header_length is None else CONTENT_TYPE_BINARY


# -- requests -------------------------------------------------------------------------------


def parse_header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` value, or None when absent."""
    if value is None:
        return None
    text = value.strip()
    # ASCII only: str.isdigit() also accepts "²" and other digits that int() refuses.
    if not (text.isascii() and text.isdigit()):
        raise InvalidInput(f"Inference-Header-Content-Length must be an integer, got {value!r}")
    return int(text)


def decode_infer_request(
    body: Buffer, header_length: int | None = None, regions: SharedMemoryRegions | None = None
) -> InferBody:
    """Parse an infer request body (JSON, or JSON header + binary tensors); inputs in shared
    memory are read from ``regions``."""
    view = memoryview(body)
    if header_length is None:
        header, binary = view, view[:0]
    else:
        if not 0 < header_length <= len(view):
            raise InvalidInput(
                f"Inference-Header-Content-Length {header_length} is outside the body "
                f"({len(view)} bytes)"
            )
        header, binary = view[:header_length], view[header_length:]
    doc = load_json_object(header)
    inputs = _decode_inputs(doc.get("inputs"), binary, header_length is not None, regions)
    params = request_parameters(doc.get("parameters"), "request")
    outputs = _decode_outputs(doc.get("outputs"), regions)
    names = tuple(o.name for o in outputs)
    classes = {o.name: o.classes for o in outputs if o.classes is not None}
    return InferBody(
        request=FrontRequest.from_parameters(inputs, names, params, _CONSUMED_PARAMS, classes),
        outputs=outputs,
        client_id=_client_id(doc.get("id")),
        binary_output=_flag(params, _PARAM_BINARY_OUTPUT),
    )


def load_json_object(data: bytes | memoryview) -> dict[str, Any]:
    """A JSON object body as Triton reads it: ``NaN``, ``Infinity`` and ``-Infinity`` values
    included (the infer and generate bodies alike); anything else is InvalidInput."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if not _at_non_finite_token(exc):
            raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
        doc = _load_json_non_finite(exc.doc)
    if not isinstance(doc, dict):
        raise InvalidInput(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


def _at_non_finite_token(exc: orjson.JSONDecodeError) -> bool:
    """orjson stopped at ``NaN``, ``Infinity`` or ``-Infinity`` (at the sign, or after it)."""
    text, pos = exc.doc, exc.pos
    return isinstance(text, str) and text.startswith(_NON_FINITE_TOKENS, pos)


def _load_json_non_finite(text: str) -> Any:
    """A body with ``NaN``, ``Infinity`` or ``-Infinity`` values, which Triton reads (rapidjson's
    kParseNanAndInfFlag) and orjson refuses: read by the stdlib's parser, every other number
    as orjson reads it (a literal past a double's range refused, an integer past 64 bits a
    float). The slow path: only a body that holds such a token comes here."""
    try:
        doc = json.loads(text, parse_float=_finite_float, parse_int=_json_int)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(text):
        # The stdlib reads a lone surrogate escape into a str that cannot be encoded again
        # (orjson refuses it): let orjson's encoder judge the strings.
        try:
            orjson.dumps(doc)
        except orjson.JSONEncodeError as exc:
            raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    return doc


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:32]} is infinity when parsed as double")
    return value


def _json_int(text: str) -> int | float:
    value = int(text)
    return value if _INT64_MIN <= value <= _UINT64_MAX else _finite_float(text)


def _client_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("request 'id' must be a string")
    return value


def request_parameters(value: Any, where: str | None, shm: bool = False) -> dict[str, Scalar]:
    """A ``parameters`` object, checked; ``where`` None: an output's, whose extensions
    ``output_classes`` checks; ``shm``: the shared memory parameters are allowed."""
    shown = where or "output"
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{shown} 'parameters' must be a JSON object")
    for key, item in value.items():
        if not isinstance(item, str | int | float | bool):
            raise InvalidInput(f"{shown} parameter {key!r} must be a string, number or bool")
    if where is not None:
        refuse_unsupported(
            {k: v for k, v in value.items() if k not in SHM_PARAMS} if shm else value, where
        )
    return value


def _flag(params: Mapping[str, Scalar], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"parameter {key!r} must be true or false")
    return value


def _decode_outputs(value: Any, regions: SharedMemoryRegions | None) -> tuple[RequestedOutput, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidInput("request 'outputs' must be a list")
    outputs: list[RequestedOutput] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidInput(f"outputs[{i}] must be an object with a non-empty 'name'")
        params = request_parameters(item.get("parameters"), None)
        shm = shm_ref(params, f"output {item['name']!r}")
        if shm is not None:
            check_shm_output(item["name"], shm, regions)
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInput(f"output {item['name']!r}: 'binary_data' must be true or false")
        classes = output_classes(params, item["name"])
        outputs.append(RequestedOutput(item["name"], binary, classes, shm))
    return tuple(outputs)


def _decode_inputs(
    value: Any, binary: memoryview, has_header: bool, regions: SharedMemoryRegions | None
) -> tuple[Tensor, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidInput("request 'inputs' must be a non-empty list")
    tensors: list[Tensor] = []
    offset = shm_bytes = 0
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidInput(f"inputs[{i}] must be a JSON object")
        name, datatype, shape = _tensor_header(item, i)
        params = request_parameters(item.get("parameters"), f"input {name!r}", shm=True)
        shm = shm_ref(params, f"input {name!r}")
        size = params.get("binary_data_size")
        if shm is not None:
            if "data" in item or size is not None:
                raise InvalidInput(f"input {name!r} is in shared memory and has data too")
            tensors.append(shm_tensor(name, datatype, shape, shm, regions, shm_bytes))
            shm_bytes += shm.byte_size
            continue
        if size is None:
            tensors.append(json_tensor(name, datatype, shape, item))
            continue
        if "data" in item:
            raise InvalidInput(f"input {name!r} has both 'data' and 'binary_data_size'")
        if not has_header:
            raise InvalidInput(
                f"input {name!r} sets binary_data_size but the request has no "
                "Inference-Header-Content-Length header"
            )
        tensor = _binary_tensor(name, datatype, shape, size, binary[offset:])
        tensors.append(tensor)
        offset += len(tensor.data)
    if offset != len(binary):
        raise InvalidInput(
            f"binary data is {len(binary)} bytes but the inputs' binary_data_size add up to "
            f"{offset}"
        )
    return tuple(tensors)


def _tensor_header(item: dict[str, Any], i: int) -> tuple[str, str, tuple[int, ...]]:
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"inputs[{i}] needs a non-empty 'name'")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise InvalidInput(f"input {name!r}: unknown datatype {datatype!r}", tensor=name)
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidInput(
            f"input {name!r}: 'shape' must be a list of non-negative integers", tensor=name
        )
    return name, datatype, tuple(shape)


def _binary_tensor(
    name: str, datatype: str, shape: tuple[int, ...], size: Scalar, rest: memoryview
) -> Tensor:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"input {name!r}: binary_data_size must be a non-negative integer")
    if size > len(rest):
        raise InvalidInput(
            f"input {name!r}: binary_data_size {size} runs past the body ({len(rest)} bytes left)",
            tensor=name,
        )
    tensor = Tensor(name, datatype, shape, rest[:size])
    expected = tensor.expected_nbytes()
    if expected is not None and expected != size:
        raise InvalidInput(
            f"input {name!r}: binary_data_size {size} but shape {list(shape)} of {datatype} "
            f"needs {expected} bytes",
            tensor=name,
        )
    return tensor


def shm_tensor(
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    ref: ShmRef,
    regions: SharedMemoryRegions | None,
    taken: int = 0,
) -> Tensor:
    """An input read from a shared memory region (both fronts); its byte size must be the
    one its shape and datatype need. ``taken``: the bytes the request's inputs before it
    read from shared memory; with this one's past ``regions.max_input_bytes`` (what a body
    may carry), PayloadTooLarge before anything is copied."""
    what = f"input {name!r}"
    if regions is None:
        raise InvalidInput(f"{what}: shared memory is not served here")
    size = itemsize(datatype)  # 0: BYTES, whose length its data says
    expected = math.prod(shape) * size
    if size and expected != ref.byte_size:
        raise InvalidInput(
            f"{what}: shared_memory_byte_size {ref.byte_size} but shape {list(shape)} of "
            f"{datatype} needs {expected} bytes",
            tensor=name,
        )
    if taken + ref.byte_size > regions.max_input_bytes:
        raise PayloadTooLarge(
            f"{what}: the request's inputs in shared memory add up to "
            f"{taken + ref.byte_size} bytes; a request may carry {regions.max_input_bytes} "
            "(gateway.max_body_bytes, kafka.max_request_bytes)",
            tensor=name,
            size=taken + ref.byte_size,
        )
    return Tensor(name, datatype, shape, regions.read(ref, what))


def json_tensor(name: str, datatype: str, shape: tuple[int, ...], item: dict[str, Any]) -> Tensor:
    """An input from its JSON ``item``'s ``data`` (a list, nested or flat), checked against
    its datatype's range and its ``shape``'s element count."""
    data = item.get("data")
    if not isinstance(data, list):
        raise InvalidInput(
            f"input {name!r} needs 'data' (a list) or parameters.binary_data_size", tensor=name
        )
    packed = _packed_floats(datatype, data)
    if packed is not None:
        if len(data) != math.prod(shape):
            raise _count_mismatch(name, len(data), shape)
        return Tensor(name, datatype, shape, packed)
    arr = _bytes_array(name, data) if datatype == "BYTES" else _numeric_array(name, datatype, data)
    if arr.size != math.prod(shape):
        raise _count_mismatch(name, arr.size, shape)
    if datatype == "BYTES":
        return Tensor(name, datatype, shape, serialize_bytes(arr))
    return Tensor(name, datatype, shape, arr.reshape(-1).data.cast("B"))


def _count_mismatch(name: str, count: int, shape: tuple[int, ...]) -> InvalidInput:
    return InvalidInput(
        f"input {name!r}: {count} data elements but shape {list(shape)} needs {math.prod(shape)}",
        tensor=name,
    )


def _packed_floats(datatype: str, data: list[Any]) -> bytes | None:
    """A float input's flat list of numbers packed by ``struct`` in one call: the common
    case, in about a third of numpy's conversion of a list. None where the general path
    must judge: another datatype, an empty or nested list, anything not a number, a value
    past the datatype's range (``struct`` refuses it as numpy's cast would make it inf),
    or a list that starts with a boolean (numpy reads a list of booleans alone as BOOL,
    which a float input refuses; a boolean among numbers is 1 or 0 on both paths)."""
    code = _PACK_CODES.get(datatype)
    if code is None or not data or type(data[0]) is bool:
        return None
    try:
        return struct.pack(f"<{len(data)}{code}", *data)
    except (struct.error, OverflowError):
        return None


def _numeric_array(name: str, datatype: str, data: list[Any]) -> np.ndarray[Any, Any]:
    dtype = to_numpy_dtype(datatype)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"input {name!r}: 'data' is not a regular array: {exc}") from exc
    if arr.size == 0:
        return np.empty(0, dtype=dtype)
    if dtype.kind in _INT_KINDS:
        return _int_array(name, datatype, arr, data)
    _check_kind(name, datatype, arr, "b" if dtype.kind == "b" else _FLOAT_KINDS)
    if dtype.kind == "b":
        return np.ascontiguousarray(arr, dtype=dtype)
    # A finite number that turns inf in the cast (1e300 for FP32) overflowed the narrower
    # type: Triton refuses it rather than computing with inf. NaN, Infinity and -Infinity
    # tokens are values (a literal past a double's range is refused when parsed).
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype)
    if not np.isfinite(out).all() and (np.isinf(out) & np.isfinite(arr)).any():
        raise _out_of_range(name, datatype)
    return out


def _int_array(
    name: str, datatype: str, arr: np.ndarray[Any, Any], data: list[Any]
) -> np.ndarray[Any, Any]:
    dtype = to_numpy_dtype(datatype)
    if arr.dtype.kind in "fO":
        # numpy makes float64 (or objects) of a mix of negative ints and ints past int64,
        # e.g. UINT64 [0, 2**64 - 1]: judge the Python ints themselves, exactly.
        exact = np.asarray(data, dtype=object).reshape(-1)
        if not all(type(v) is int for v in exact):
            _check_kind(name, datatype, arr, _INT_KINDS)
        values: Any = exact.tolist()
        low, high = min(values), max(values)
    else:
        _check_kind(name, datatype, arr, _INT_KINDS)
        values, low, high = arr, arr.min(), arr.max()
    info = np.iinfo(cast("np.dtype[np.integer[Any]]", dtype))
    if low < info.min or high > info.max:
        raise _out_of_range(name, datatype)
    return np.ascontiguousarray(values, dtype=dtype)


def _check_kind(name: str, datatype: str, arr: np.ndarray[Any, Any], allowed: str) -> None:
    if arr.dtype.kind not in allowed:
        raise InvalidInput(
            f"input {name!r}: 'data' holds {_kind_name(arr.dtype.kind)} values, not {datatype}",
            tensor=name,
        )


def _out_of_range(name: str, datatype: str) -> InvalidInput:
    return InvalidInput(f"input {name!r}: a value is out of range for {datatype}", tensor=name)


def _kind_name(kind: str) -> str:
    return {"b": "boolean", "i": "integer", "u": "integer", "f": "float", "U": "string"}.get(
        kind, "mixed or non-numeric"
    )


def _bytes_array(name: str, data: list[Any]) -> np.ndarray[Any, Any]:
    flat = _flatten(name, data)
    if not all(isinstance(s, str) for s in flat):
        raise InvalidInput(f"input {name!r}: BYTES data must be strings", tensor=name)
    arr = np.empty(len(flat), dtype=object)
    arr[:] = [s.encode() for s in flat]
    return arr


def _flatten(name: str, data: list[Any]) -> list[Any]:
    """Nested lists -> one flat list, without recursion and at most ``MAX_NESTING`` deep."""
    if not any(isinstance(d, list) for d in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif not isinstance(item, list):
            out.append(item)
        elif len(stack) >= MAX_NESTING:
            raise InvalidInput(
                f"input {name!r}: 'data' is nested deeper than {MAX_NESTING} lists", tensor=name
            )
        else:
            stack.append(iter(item))
    return out


# -- responses ------------------------------------------------------------------------------


def encode_infer_response(
    result: InferResult,
    *,
    response_id: str,
    binary: Callable[[str], bool],
    extra: Mapping[str, Any] | None = None,
    shm: Callable[[str], ShmRef | None] | None = None,
    regions: SharedMemoryRegions | None = None,
) -> EncodedBody:
    """The response body for a successful result; ``binary(name)`` picks each output's form,
    and an output that ``shm(name)`` places in shared memory is written to ``regions``."""
    doc: dict[str, Any] = dict(extra or {})
    doc.update(model_name=result.model, model_version=result.version, id=response_id)
    outputs: list[dict[str, Any]] = []
    blobs: list[Buffer] = []
    for tensor in result.outputs:
        ref = None if shm is None else shm(tensor.name)
        if ref is not None:
            outputs.append(shm_output(tensor, ref, regions))
        elif binary(tensor.name):
            outputs.append(_binary_output(tensor))
            blobs.append(tensor.data)
        else:
            outputs.append(_json_output(tensor))
    doc["outputs"] = outputs
    if result.parameters:
        doc["parameters"] = dict(result.parameters)
    header = orjson.dumps(doc, option=_NUMPY_OPTS)
    if not blobs:
        return EncodedBody(header)
    return EncodedBody(b"".join([header, *blobs]), header_length=len(header))


def check_shm_output(name: str, ref: ShmRef, regions: SharedMemoryRegions | None) -> None:
    """A requested output's shared memory (both fronts), checked as its request is decoded,
    before it is published: the region is registered and holds ``offset`` + ``byte_size``
    (an output larger than its byte size is found when it is written)."""
    what = f"output {name!r}"
    if regions is None:
        raise InvalidInput(f"{what}: shared memory is not served here")
    regions.check(ref, what)


def write_shm_output(tensor: Tensor, ref: ShmRef, regions: SharedMemoryRegions | None) -> None:
    """Put an output's bytes in its shared memory region (both fronts)."""
    what = f"output {tensor.name!r}"
    if regions is None:
        raise InvalidInput(f"{what}: shared memory is not served here")
    regions.write(ref, tensor.data, what)


def shm_output(tensor: Tensor, ref: ShmRef, regions: SharedMemoryRegions | None) -> dict[str, Any]:
    """An output written to shared memory, answered by name, type and shape alone: with no
    ``parameters`` either, since Triton's C++ HTTP client reads an output's parameters as
    binary data (``binary_data_size``) whenever they are there."""
    write_shm_output(tensor, ref, regions)
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def _binary_output(tensor: Tensor) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
        "parameters": {"binary_data_size": len(tensor.data)},
    }


def result_doc(
    result: InferResult,
    response_id: str,
    binary: Callable[[str], bool] | None = None,
    blobs: list[Buffer] | None = None,
) -> dict[str, Any]:
    """A successful result as a JSON response object (what ``encode_infer_response`` makes,
    as a dict): an output that ``binary(name)`` picks is described as binary data and its
    bytes appended to ``blobs`` (the body's tail, in order), the others are JSON data.
    Nothing is appended when an output cannot be JSON (InvalidInput, ``utf8_texts``)."""
    outputs: list[dict[str, Any]] = []
    tail: list[Buffer] = []
    for tensor in result.outputs:
        if binary is not None and binary(tensor.name):
            outputs.append(_binary_output(tensor))
            tail.append(tensor.data)
        else:
            outputs.append(_json_output(tensor))
    if blobs is not None:
        blobs.extend(tail)
    doc: dict[str, Any] = {
        "model_name": result.model,
        "model_version": result.version,
        "id": response_id,
        "outputs": outputs,
    }
    if result.parameters:
        doc["parameters"] = dict(result.parameters)
    return doc


def _json_output(tensor: Tensor) -> dict[str, Any]:
    arr = tensor.to_numpy().reshape(-1)
    data: Any = arr
    if tensor.datatype == "BYTES":
        data = utf8_texts(tensor.name, arr)
    elif arr.dtype.kind == "f" and not np.isfinite(arr).all():
        data = non_finite_json(arr)
    return {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": list(tensor.shape),
        "data": data,
    }


def utf8_texts(name: str, arr: np.ndarray[Any, Any]) -> list[str]:
    """A BYTES output's elements as JSON strings (infer's). One that is not UTF-8 cannot be
    one without changing it (Triton writes its raw bytes into the JSON, which then is not
    UTF-8): it is refused rather than altered, and the caller told to ask for it as binary
    data, which carries any bytes. (generate replaces such bytes: it has no binary form.)"""
    texts: list[str] = []
    for i, element in enumerate(arr):
        try:
            texts.append(element.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"output {name!r} element {i} is not valid UTF-8, so a JSON answer cannot "
                'carry it intact: request the output as binary data ("binary_data": true)'
            ) from exc
    return texts


def non_finite_json(arr: np.ndarray[Any, Any]) -> orjson.Fragment:
    """Float values holding NaN or inf as JSON text with Triton's tokens for them (rapidjson's
    kWriteNanAndInfFlag) where orjson writes null: orjson writes the finite values (their
    shortest digits, as elsewhere), then each null, in order, becomes its value's token.
    A flat array is written as a list; a 0-d one as its one value (generate's answers)."""
    odd = arr[~np.isfinite(arr)]
    kinds = np.where(np.isnan(odd), 0, np.where(odd > 0, 1, 2)).tolist()
    parts = orjson.dumps(arr.reshape(-1), option=_NUMPY_OPTS).split(b"null")
    out = [parts[0]]
    for kind, part in zip(kinds, parts[1:], strict=True):
        out += (_NON_FINITE_OUT[kind], part)
    text = b"".join(out)
    return orjson.Fragment(text[1:-1] if arr.ndim == 0 else text)


def encode_json(doc: Any) -> bytes:
    """Any JSON body the gateway sends (numpy values allowed)."""
    return orjson.dumps(doc, option=_NUMPY_OPTS)


# -- metadata -------------------------------------------------------------------------------


def server_metadata(version: str, extensions: Sequence[str]) -> dict[str, Any]:
    return {"name": "plaza", "version": version, "extensions": list(extensions)}


def model_metadata(spec: ModelSpec, versions: Sequence[int]) -> dict[str, Any]:
    """KServe v2 model metadata; shapes carry a -1 batch dimension when the model batches."""
    return {
        "name": spec.name,
        "versions": [str(v) for v in versions],
        "platform": spec.platform,
        "inputs": [_tensor_metadata(t, spec.max_batch_size) for t in spec.inputs],
        "outputs": [_tensor_metadata(t, spec.max_batch_size) for t in spec.outputs],
    }


def _tensor_metadata(t: TensorSpec, max_batch_size: int) -> dict[str, Any]:
    shape = [-1, *t.dims] if max_batch_size > 0 else list(t.dims)
    return {"name": t.name, "datatype": t.datatype, "shape": shape}
