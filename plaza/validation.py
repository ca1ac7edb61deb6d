"""Checks one request against its model's configuration, before it may join a batch.

Each request is validated on its own so that a bad one never fails its batch-mates. The
same function serves the worker (authoritative) and the gateway (early 400s).
"""

from __future__ import annotations

from plaza.contract import InferRequest
from plaza.errors import InvalidInput
from plaza.modelconfig import ModelSpec, TensorSpec
from plaza.reshape import reshape
from plaza.sequence_batching import sequence_flags
from plaza.sequence_config import CORRID
from plaza.tensors import INTP_MAX, Tensor, check_bytes_layout, numpy_holds


def _check_shape(tensor: Tensor, spec: TensorSpec, max_batch_size: int) -> int:
    """The request's batch size (rows), or InvalidInput if the shape does not fit."""
    shape = tensor.shape
    if max_batch_size > 0:
        if len(shape) != len(spec.dims) + 1:
            raise InvalidInput(
                f"input {tensor.name!r}: shape {list(shape)} must be [batch] + {list(spec.dims)}",
                tensor=tensor.name,
            )
        rows, rest = shape[0], shape[1:]
        if not 1 <= rows <= max_batch_size:
            raise InvalidInput(
                f"input {tensor.name!r}: batch size {rows} is outside 1..{max_batch_size}",
                tensor=tensor.name,
            )
    else:
        rows, rest = 1, shape
        if len(rest) != len(spec.dims):
            raise InvalidInput(
                f"input {tensor.name!r}: shape {list(shape)} does not match dims {list(spec.dims)}",
                tensor=tensor.name,
            )
    for got, want in zip(rest, spec.dims, strict=True):
        if want != -1 and got != want:
            raise InvalidInput(
                f"input {tensor.name!r}: shape {list(shape)} does not match dims {list(spec.dims)}",
                tensor=tensor.name,
            )
    return rows


def _check_size(tensor: Tensor, max_batch_size: int) -> None:
    """A shape that fits the dims (a -1 takes any size) but that no array can have: numpy
    refuses it, even with a zero dimension (nothing to hold), when the worker makes the
    request's array or stacks a batch of up to ``max_batch_size`` of them. Refused here,
    as any bad input is, not as the model's failure."""
    shape = tensor.shape
    stacked = (max_batch_size, *shape[1:]) if max_batch_size > 0 else shape
    if numpy_holds(shape, tensor.datatype) and numpy_holds(stacked, tensor.datatype):
        return
    where = f" (in a batch of up to {max_batch_size} rows)" if max_batch_size > 0 else ""
    raise InvalidInput(
        f"input {tensor.name!r}: shape {list(shape)} is too large for a tensor of "
        f"{tensor.datatype}{where}: each dimension must be at most {INTP_MAX}, and the "
        f"product of the non-zero ones times the element size too",
        tensor=tensor.name,
    )


def _check_reshape(tensor: Tensor, target: tuple[int, ...], batched: bool) -> None:
    """A shape that fits dims but not the model's (a -1 in dims settled to a size that the
    config's reshape cannot take)."""
    if reshape(tensor.shape, target, batched) is None:
        raise InvalidInput(
            f"input {tensor.name!r}: shape {list(tensor.shape)} cannot be reshaped to the "
            f"model's {list(target)} (config.pbtxt reshape)",
            tensor=tensor.name,
        )


def _check_data(tensor: Tensor) -> None:
    expected = tensor.expected_nbytes()
    if expected is None:
        try:  # sizes are checked before anything is allocated from the shape
            check_bytes_layout(tensor.data, tensor.element_count)
        except InvalidInput as exc:
            raise InvalidInput(f"input {tensor.name!r}: {exc.message}", tensor=tensor.name) from exc
    elif len(tensor.data) != expected:
        raise InvalidInput(
            f"input {tensor.name!r}: {len(tensor.data)} bytes of data, shape "
            f"{list(tensor.shape)} of {tensor.datatype} needs {expected}",
            tensor=tensor.name,
        )


def validate_request(req: InferRequest, spec: ModelSpec) -> int:
    """Raise InvalidInput unless ``req`` fits ``spec``; return its batch size (rows)."""
    given = {t.name: t for t in req.inputs}
    if len(given) != len(req.inputs):
        raise InvalidInput("an input name appears twice")
    unknown = sorted(set(given) - {s.name for s in spec.inputs})
    if unknown:
        raise InvalidInput(f"unknown input(s) {unknown} for model {spec.name!r}")
    rows: set[int] = set()
    for ispec in spec.inputs:
        tensor = given.get(ispec.name)
        if tensor is None:
            if ispec.optional:
                continue
            raise InvalidInput(f"missing input {ispec.name!r} for model {spec.name!r}")
        if tensor.datatype != ispec.datatype:
            raise InvalidInput(
                f"input {ispec.name!r}: datatype {tensor.datatype} but the model expects "
                f"{ispec.datatype}",
                tensor=ispec.name,
            )
        rows.add(_check_shape(tensor, ispec, spec.max_batch_size))
        if ispec.reshape is not None:
            _check_reshape(tensor, ispec.reshape, spec.max_batch_size > 0)
        _check_data(tensor)
        _check_size(tensor, spec.max_batch_size)  # (after the data: its count is clearer)
    if len(rows) > 1:
        raise InvalidInput(f"inputs disagree on the batch size: {sorted(rows)}")
    if req.outputs:
        _check_outputs(req, spec)
    if req.classification:
        _check_classification(req, spec)
    count = rows.pop() if rows else 1
    if spec.sequence.enabled:
        _check_sequence(req, spec, count)
    return count


def _check_outputs(req: InferRequest, spec: ModelSpec) -> None:
    """Requested outputs: the model's, each once (as inputs are: a repeated one would come
    back twice, and the fronts' per-output options would disagree)."""
    seen: set[str] = set()
    for name in req.outputs:
        if spec.output(name) is None:
            raise InvalidInput(f"unknown output {name!r} for model {spec.name!r}")
        if name in seen:
            raise InvalidInput(f"output {name!r} is requested twice", tensor=name)
        seen.add(name)


_CORRID_MAX = {"INT32": 2**31 - 1, "UINT32": 2**32 - 1, "INT64": 2**63 - 1, "UINT64": 2**64 - 1}
"""The largest sequence id each CORRID control type holds (the worker's tensor of it)."""


def _check_sequence(req: InferRequest, spec: ModelSpec, rows: int) -> None:
    """A stateful model's request: its sequence parameters, one row, an integer id where
    the model takes the id as a CORRID control of an integer type."""
    flags = sequence_flags(req.parameters, spec.name)
    if rows != 1:
        raise InvalidInput(f"a request of sequence {flags.key!r} holds {rows} rows: one at most")
    for control in spec.sequence.controls:
        if control.kind != CORRID:
            continue
        if isinstance(flags.key, str):
            raise InvalidInput(
                f"model {spec.name!r} takes the sequence id as a number (its CORRID control): "
                f"sequence_id {flags.key!r} must be an integer"
            )
        largest = _CORRID_MAX[control.datatype]
        if flags.key > largest:  # (a sequence id is at least 1: sequence_flags checks it)
            raise InvalidInput(
                f"model {spec.name!r} takes the sequence id as {control.datatype} (its CORRID "
                f"control {control.name!r}): sequence_id {flags.key} is past {largest}"
            )


CLASSIFIABLE = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
)
"""The output datatypes Triton's classification extension ranks (its TopkClassifications);
it refuses the others (BOOL, FP16, BYTES) as an invalid argument."""


def _check_classification(req: InferRequest, spec: ModelSpec) -> None:
    """Triton's classification extension: requested outputs of a ``CLASSIFIABLE``
    datatype; counts >= 1."""
    for name, count in req.classification.items():
        ospec = spec.output(name)
        if ospec is None:
            raise InvalidInput(f"classification of unknown output {name!r} for model {spec.name!r}")
        if req.outputs and name not in req.outputs:
            raise InvalidInput(f"output {name!r} is to be classified but is not requested")
        if ospec.datatype not in CLASSIFIABLE:
            raise InvalidInput(
                f"output {name!r} is {ospec.datatype}: class results are not available for "
                "it (only integer, FP32 and FP64 outputs can be classified, as in Triton)",
                tensor=name,
            )
        if type(count) is not int or count < 1:
            raise InvalidInput(f"output {name!r}: classification count must be >= 1, got {count!r}")
