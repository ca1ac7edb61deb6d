"""KServe v2 gRPC messages <-> Plaza tensors: the gRPC front's only wire-format module.

The messages are the ones tritonclient ships (``tritonclient.grpc.service_pb2``). Inputs
come either as ``raw_input_contents`` (one bytes entry per input, in input order, already in
Plaza's layout: little-endian, Triton's length-prefixed BYTES, so they are used without a
copy) or as typed ``contents`` (``fp32_contents``, ``int_contents``, ... converted through
numpy once). A request that mixes the two is refused, as Triton refuses it. Outputs always
go back as ``raw_output_contents``, which is what Triton's server does and what
tritonclient's ``as_numpy`` reads. Anything malformed raises ``InvalidInput``.

Triton's system shared memory extension (``plaza.gateway.shared_memory``): an input whose
parameters name a registered region is read from it (``raw_input_contents`` then hold the
other inputs', in order, as tritonclient sends them), and an output requested into a region
is checked against it as the request is decoded, written there and answered with an empty
``raw_output_contents`` entry, which keeps the other outputs' entries at their index.

Triton's ``triton_enable_empty_final_response`` request parameter (a bool, for streams to
decoupled models) is the front's own: taken out of the parameters the worker receives and
read with ``wants_empty_final``: it only decides whether an empty final response is sent.
Every stream response says whether it is the request's last in its
``triton_final_response`` parameter (``mark_final``), as Triton's, beside the parameters its model
attached to it (``ModelInferResponse.parameters``, each as its kind: ``encode_parameters``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from plaza.contract import InferResult, Scalar
from plaza.datatypes import DATATYPES, to_numpy_dtype
from plaza.errors import InvalidInput
from plaza.gateway.kserve import check_shm_output, shm_tensor, write_shm_output
from plaza.gateway.requests import FrontRequest, output_classes, refuse_unsupported
from plaza.gateway.shared_memory import (
    PARAM_BYTE_SIZE,
    PARAM_OFFSET,
    PARAM_REGION,
    SharedMemoryRegions,
    ShmRef,
    shm_ref,
)
from plaza.tensors import Tensor, serialize_bytes

PARAM_EMPTY_FINAL = "triton_enable_empty_final_response"
"""Request parameter (bool): send a decoupled model's empty final response, and mark every
response with ``PARAM_FINAL_RESPONSE``."""
PARAM_FINAL_RESPONSE = "triton_final_response"
"""Response parameter (bool): the request's last response."""

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


def decode_infer_request(
    msg: pb.ModelInferRequest, regions: SharedMemoryRegions | None = None
) -> FrontRequest:
    """A ``ModelInferRequest`` as Plaza tensors and parameters, inputs in shared memory read
    from ``regions`` (outputs' regions checked there); InvalidInput if malformed. (The
    response echoes the message's ``id``.)"""
    raw = msg.raw_input_contents
    refs = [_input_shm(item) for item in msg.inputs]
    in_messages = len(refs) - refs.count(None)
    if raw and len(raw) != len(msg.inputs) - in_messages:
        raise InvalidInput(
            f"{len(raw)} raw_input_contents for {len(msg.inputs) - in_messages} inputs not in "
            "shared memory: when raw contents are used, each of those inputs must have one, "
            "in input order"
        )
    tensors: list[Tensor] = []
    taken = shm_bytes = 0
    for item, ref in zip(msg.inputs, refs, strict=True):
        if ref is not None:
            if item.HasField("contents"):
                raise InvalidInput(f"input {item.name!r} is in shared memory and has contents too")
            shape = tuple(item.shape)
            tensors.append(shm_tensor(item.name, item.datatype, shape, ref, regions, shm_bytes))
            shm_bytes += ref.byte_size
            continue
        tensors.append(_input_tensor(item, raw[taken] if raw else None))
        taken += 1
    outputs = tuple(str(o.name) for o in msg.outputs)
    classes: dict[str, int] = {}
    shm_outputs: dict[str, ShmRef] = {}
    for o in msg.outputs:
        count, ref = _requested_output(o)
        if count is not None:
            classes[str(o.name)] = count
        if ref is not None:
            check_shm_output(o.name, ref, regions)  # before the request is published
            shm_outputs[str(o.name)] = ref
    params = decode_parameters(msg.parameters, "request")
    refuse_unsupported(params, "request")
    return FrontRequest.from_parameters(
        tuple(tensors),
        outputs,
        params,
        consumed=frozenset({PARAM_EMPTY_FINAL}),
        classification=classes,
        shm_outputs=shm_outputs,
    )


def wants_empty_final(msg: pb.ModelInferRequest) -> bool:
    """The request's ``triton_enable_empty_final_response`` (False when absent);
    InvalidInput when it is not a bool."""
    param = msg.parameters.get(PARAM_EMPTY_FINAL)
    if param is None:
        return False
    if param.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidInput(f"parameter {PARAM_EMPTY_FINAL!r} must be a bool")
    return bool(param.bool_param)


def mark_final(msg: pb.ModelInferResponse, final: bool) -> pb.ModelInferResponse:
    """``msg`` with its ``triton_final_response`` parameter set to ``final``."""
    msg.parameters[PARAM_FINAL_RESPONSE].bool_param = final
    return msg


def _input_shm(item: pb.ModelInferRequest.InferInputTensor) -> ShmRef | None:
    """The input's shared memory region (None: its data is in the message); its other
    parameters are checked. Most inputs have none: no message is formatted for them."""
    if not item.parameters:
        return None
    where = f"input {item.name!r}"
    params = decode_parameters(item.parameters, where)
    ref = shm_ref(params, where)
    refuse_unsupported(params, where)
    if ref is not None:
        _check_header(item)
    return ref


def _check_header(item: pb.ModelInferRequest.InferInputTensor) -> None:
    name, datatype = item.name, item.datatype
    if datatype not in DATATYPES:
        raise InvalidInput(f"input {name!r}: unknown datatype {datatype!r}", tensor=name)
    if item.shape and min(item.shape) < 0:
        raise InvalidInput(f"input {name!r}: negative dimension in shape {list(item.shape)}")


def _input_tensor(item: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> Tensor:
    name, datatype = item.name, item.datatype
    _check_header(item)
    shape = tuple(item.shape)  # int64 values: Python ints already
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


def _requested_output(
    item: pb.ModelInferRequest.InferRequestedOutputTensor,
) -> tuple[int | None, ShmRef | None]:
    """The output's ``classification`` count and shared memory region (None: none asked);
    its other parameters checked."""
    if not item.parameters:
        return None, None
    where = f"output {item.name!r}"
    params = decode_parameters(item.parameters, where)
    ref = shm_ref(params, where)
    return output_classes(params, item.name), ref


def decode_parameters(params: Mapping[str, pb.InferParameter], where: str) -> dict[str, Scalar]:
    """``map<string, InferParameter>`` as plain values; InvalidInput for an empty one."""
    out: dict[str, Scalar] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidInput(f"{where}: parameter {key!r} has no value")
        out[key] = getattr(param, kind)
    return out


def encode_parameters(
    params: Mapping[str, Scalar], into: MutableMapping[str, pb.InferParameter]
) -> None:
    """Plain values into a ``map<string, InferParameter>``, each as its kind: bool_param,
    int64_param, string_param (and double_param)."""
    for key, value in params.items():
        param = into[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            param.double_param = value


def encode_infer_response(
    result: InferResult,
    response_id: str,
    shm_outputs: Mapping[str, ShmRef] | None = None,
    regions: SharedMemoryRegions | None = None,
) -> pb.ModelInferResponse:
    """A ``ModelInferResponse`` with every output in ``raw_output_contents``, but those that
    ``shm_outputs`` places in shared memory: written to ``regions``, their entry empty."""
    msg = pb.ModelInferResponse(
        model_name=result.model, model_version=result.version, id=response_id
    )
    if result.parameters:
        encode_parameters(result.parameters, msg.parameters)
    for tensor in result.outputs:
        out = msg.outputs.add()
        out.name, out.datatype = tensor.name, tensor.datatype
        out.shape.extend(tensor.shape)
        ref = shm_outputs.get(tensor.name) if shm_outputs else None
        if ref is None:
            msg.raw_output_contents.append(bytes(tensor.data))
            continue
        write_shm_output(tensor, ref, regions)
        out.parameters[PARAM_REGION].string_param = ref.region
        out.parameters[PARAM_BYTE_SIZE].int64_param = len(tensor.data)
        out.parameters[PARAM_OFFSET].int64_param = ref.offset
        msg.raw_output_contents.append(b"")
    return msg
