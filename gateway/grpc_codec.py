"""KServe v2 gRPC messages <-> Plaza tensors: the gRPC front's only wire-format module.

The messages are the ones tritonclient ships (``tritonclient.grpc.service_pb2``). Inputs
come either as ``raw_input_contents`` (one bytes entry per input, in input order, already in
Plaza's layout: little-endian, Triton's length-prefixed BYTES, so they are used without a
copy) or as typed ``contents`` (``fp32_contents``, ``int_contents``, ... converted through
numpy once). A request that mixes the two is refused, as Triton refuses it. Outputs always
go back as ``raw_output_contents``, which is what Triton's server does and what
tritonclient's ``as_numpy`` reads. Anything malformed raises ``InvalidInput``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from plaza.contract import InferResult, Scalar
from plaza.datatypes import DATATYPES, to_numpy_dtype
from plaza.errors import InvalidInput
from plaza.gateway.requests import FrontRequest, output_classes, refuse_unsupported
from plaza.tensors import Tensor, serialize_bytes

_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""Which typed ``InferTensorContents`` field carries each datatype (FP16/BF16: raw only)."""


def decode_infer_request(msg: pb.ModelInferRequest) -> FrontRequest:
    """A ``ModelInferRequest`` as Plaza tensors and parameters; InvalidInput if malformed.
    (The response echoes the message's own ``id``.)"""
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise InvalidInput(
            f"{len(raw)} raw_input_contents for {len(msg.inputs)} inputs: when raw contents "
            "are used, every input must have one, in input order"
        )
    inputs = tuple(
        _input_tensor(item, raw[i] if raw else None) for i, item in enumerate(msg.inputs)
    )
    outputs = tuple(str(o.name) for o in msg.outputs)
    classes = {str(o.name): n for o in msg.outputs if (n := _output_classes(o)) is not None}
    params = decode_parameters(msg.parameters, "request")
    refuse_unsupported(params, "request")
    return FrontRequest.from_parameters(inputs, outputs, params, classification=classes)


def _input_tensor(item: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> Tensor:
    name, datatype = item.name, item.datatype
    if datatype not in DATATYPES:
        raise InvalidInput(f"input {name!r}: unknown datatype {datatype!r}", tensor=name)
    shape = tuple(item.shape)  # int64 values: Python ints already
    if shape and min(shape) < 0:
        raise InvalidInput(f"input {name!r}: negative dimension in shape {list(shape)}")
    if item.parameters:  # most inputs have none: no message formatted for them
        where = f"input {name!r}"
        refuse_unsupported(decode_parameters(item.parameters, where), where)
    has_contents = item.HasField("contents")
    if raw is not None:
        if has_contents:
            raise InvalidInput(
                f"input {name!r}: contents and raw_input_contents cannot both be given"
            )
        return Tensor(name, datatype, shape, raw)
    if not has_contents:
        raise InvalidInput(f"input {name!r}: no contents and no raw_input_contents")
    return Tensor(name, datatype, shape, _typed_contents(name, datatype, item.contents))


def _typed_contents(name: str, datatype: str, contents: pb.InferTensorContents) -> bytes:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input {name!r}: {datatype} travels only as raw_input_contents")
    others = [f.name for f, _ in contents.ListFields() if f.name != field]
    if others:
        raise InvalidInput(f"input {name!r} of {datatype}: expected {field}, got {others[0]}")
    values = getattr(contents, field)
    if datatype == "BYTES":
        return serialize_bytes(np.array(list(values), dtype=object))
    dtype = to_numpy_dtype(datatype)
    array = np.asarray(values, dtype=np.float64 if dtype.kind == "f" else None)
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype.name)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise InvalidInput(f"input {name!r}: a value is out of range for {datatype}")
    return np.asarray(array, dtype=dtype).tobytes()


def _output_classes(item: pb.ModelInferRequest.InferRequestedOutputTensor) -> int | None:
    """The output's ``classification`` count (None: none asked); its parameters checked."""
    if not item.parameters:
        return None
    return output_classes(decode_parameters(item.parameters, f"output {item.name!r}"), item.name)


def decode_parameters(params: Mapping[str, pb.InferParameter], where: str) -> dict[str, Scalar]:
    """``map<string, InferParameter>`` as plain values; InvalidInput for an empty one."""
    out: dict[str, Scalar] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidInput(f"{where}: parameter {key!r} has no value")
        out[key] = getattr(param, kind)
    return out


def encode_infer_response(result: InferResult, response_id: str) -> pb.ModelInferResponse:
    """A ``ModelInferResponse`` with every output in ``raw_output_contents``."""
    msg = pb.ModelInferResponse(
        model_name=result.model, model_version=result.version, id=response_id
    )
    for tensor in result.outputs:
        out = msg.outputs.add()
        out.name, out.datatype = tensor.name, tensor.datatype
        out.shape.extend(tensor.shape)
        msg.raw_output_contents.append(bytes(tensor.data))
    return msg
