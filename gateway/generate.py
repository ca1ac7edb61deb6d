"""Triton's generate extension: a text-first JSON body for a model, over HTTP only.

``POST /v2/models/{model}[/versions/{version}]/generate`` (and ``generate_stream``) take one
JSON object. Each of the model's inputs is a top-level key of its own name, whose value is a
JSON scalar (a string for BYTES) or a list, nested or flat; ``parameters`` is an object of
scalars; ``id`` is the client's label; any other top-level key with a scalar value is a
parameter too (Triton: extra properties are "passed either as parameters or tensors based
on model specification"). An input takes the model's dims: a nested list of that shape
(for a batching model, optionally with a leading batch dim of 1), or a scalar or flat list
whose values fill its fixed dims and at most one variable one; a batching model gets a
batch of one. A nested list of another shape, or a ragged one, is refused. The answer is
one object: ``model_name``, ``model_version``, ``id`` when given, the response's
parameters (a Python model's ``InferenceResponse(parameters=...)``) by their names, as
Triton's generate answers them, and each output by its name: its one value, or a flat list
of its values (BYTES as text); as in Triton, a field of the answer is never replaced by a
later one of its name (an output named ``model_name``, or ``id`` beside the client's,
is left out, and logged). Float values may be ``NaN``, ``Infinity`` or ``-Infinity``, both
ways, read and written by the infer body's own code (``plaza.gateway.kserve``:
``load_json_object``, ``non_finite_json``).

``generate_stream`` answers as server-sent events (``text/event-stream``). An ordinary
model answers a request once: the stream holds that one answer as one ``data:`` event. A
decoupled model (``model_transaction_policy { decoupled: true }``) answers any number of
times: one ``data:`` event per response, sent as it comes (its empty final response sends
none). An error met before the first event (a bad body, a first response that is an
error, no response in time) is answered as a JSON error with its status, as Triton answers
an error met before inference began; one met after it ends the stream with an error event,
``data: {"error": <message>, "code": <code>}``, the body an HTTP error would have (a
timeout's with the ``job_id`` to poll). ``generate`` needs exactly one answer, so it
refuses a decoupled model (``unsupported``, 400) and points to ``generate_stream``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from plaza.contract import InferResult, Scalar
from plaza.errors import InvalidInput, PlazaError, error_from_wire
from plaza.gateway.errors import error_body
from plaza.gateway.kserve import (
    MAX_NESTING,
    encode_json,
    json_tensor,
    load_json_object,
    non_finite_json,
    request_parameters,
)
from plaza.gateway.requests import FrontRequest, refuse_unsupported
from plaza.modelconfig import ModelSpec, TensorSpec
from plaza.tasks import cancel_and_wait
from plaza.tensors import Tensor

log = logging.getLogger(__name__)

CONTENT_TYPE_SSE = "text/event-stream; charset=utf-8"
SSE_AHEAD = 1024
"""Events a generate_stream takes ahead of its client (as a gRPC stream's answers wait)."""
_RESERVED = frozenset({"parameters", "id"})


def load_generate_body(raw: bytes) -> dict[str, Any]:
    """A generate body's JSON object, read as an infer body is (Triton's ``NaN``,
    ``Infinity`` and ``-Infinity`` tokens included); an empty body is an empty object."""
    return load_json_object(raw) if raw.strip() else {}


def decode_generate_request(doc: Any, spec: ModelSpec) -> tuple[FrontRequest, str | None]:
    """The request a generate body makes for ``spec``'s model, and the client's ``id``."""
    if not isinstance(doc, dict):
        raise InvalidInput("a generate request body must be a JSON object")
    params = dict(request_parameters(doc.get("parameters"), "request"))
    by_name = {t.name: t for t in spec.inputs}
    inputs: list[Tensor] = []
    for key, value in doc.items():
        if key in _RESERVED:
            continue
        if key in by_name:
            inputs.append(_input(by_name[key], value, spec.max_batch_size > 0))
        elif isinstance(value, str | int | float | bool) and key not in params:
            params[key] = value
        else:
            known = ", ".join(repr(t.name) for t in spec.inputs)
            raise InvalidInput(
                f"{key!r} is not an input of model {spec.name!r} ({known}), nor a parameter "
                "(a string, number or bool not also in 'parameters')"
            )
    refuse_unsupported(params, "request")  # the top-level ones too
    client_id = doc.get("id")
    if client_id is not None and not isinstance(client_id, str):
        raise InvalidInput("'id' must be a string")
    return FrontRequest.from_parameters(tuple(inputs), (), params), client_id


def _input(spec: TensorSpec, value: Any, batched: bool) -> Tensor:
    shape = _shape(spec, value, batched)
    data = value if isinstance(value, list) else [value]
    return json_tensor(spec.name, spec.datatype, (1, *shape) if batched else shape, {"data": data})


def _shape(spec: TensorSpec, value: Any, batched: bool) -> tuple[int, ...]:
    """The shape ``value`` takes in ``spec``'s dims (the batch dim left out). A scalar or a
    flat list fills them: its values spread over the fixed dims, one variable dim taking
    the rest. A nested list keeps its own shape, which must match the dims (``-1`` any
    length; a batching model's input may also be nested with a leading batch of one):
    spread, a 3x2 list would reach a ``[2, -1]`` input as a scrambled 2x3."""
    nested = _nesting(spec.name, value)
    dims = spec.dims
    if len(nested) >= 2:
        if _fits(nested, dims):
            return nested
        if batched and nested[0] == 1 and _fits(nested[1:], dims):
            return nested[1:]
        batch = f", or [1, {', '.join(map(str, dims))}] with the batch dim" if batched else ""
        raise InvalidInput(
            f"input {spec.name!r}: a nested list of shape {list(nested)} does not match its "
            f"dims {list(dims)}{batch}: nest it as the dims, or send its values as a flat list",
            tensor=spec.name,
        )
    count = math.prod(nested)
    fixed = math.prod(d for d in dims if d != -1)
    free = sum(1 for d in dims if d == -1)
    if (free == 0 and fixed == count) or (free == 1 and fixed and count % fixed == 0):
        return tuple(count // fixed if d == -1 else d for d in dims)
    raise InvalidInput(
        f"input {spec.name!r}: {count} values do not fit its dims {list(dims)}", tensor=spec.name
    )


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, n) for d, n in zip(dims, shape, strict=True))


def _nesting(name: str, value: Any) -> tuple[int, ...]:
    """The shape of nested lists (a scalar: ``()``), read down their first items and then
    checked: every list at one depth has that depth's length, and holds lists exactly
    down to the last depth."""
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        if len(shape) >= MAX_NESTING:
            raise InvalidInput(
                f"input {name!r}: nested deeper than {MAX_NESTING} lists", tensor=name
            )
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    if len(shape) >= 2:
        _check_regular(name, value, shape)
    return tuple(shape)


def _check_regular(name: str, value: list[Any], shape: list[int]) -> None:
    """Refuses a ragged nested list, level by level (no recursion)."""
    level: list[Any] = value
    for depth, length in enumerate(shape[1:], start=1):
        if not all(isinstance(item, list) and len(item) == length for item in level):
            raise _ragged(name, shape, depth)
        level = [item for sub in level for item in sub]
    if any(isinstance(item, list) for item in level):
        raise _ragged(name, shape, len(shape))


def _ragged(name: str, shape: list[int], depth: int) -> InvalidInput:
    want = f"a list of {shape[depth]}" if depth < len(shape) else "a value, not a list"
    return InvalidInput(
        f"input {name!r}: a ragged nested list: at depth {depth} each item must be {want} "
        f"(its first items make its shape {shape}); nest it as a regular array",
        tensor=name,
    )


def generate_response(result: InferResult, client_id: str | None) -> dict[str, Any]:
    """The answer's JSON object: the model, the response's parameters and each output by
    name. As in Triton (whose answer keeps the first of a name: its own fields, then the
    parameters, then the outputs), a parameter or an output never replaces
    ``model_name``, ``model_version`` or ``id`` (the client's, when given), and an output
    never replaces a parameter of its name; such an output is left out, and logged once."""
    doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version}
    if client_id is not None:
        doc["id"] = client_id
    for key, value in result.parameters.items():
        doc.setdefault(key, value)
    for tensor in result.outputs:
        if tensor.name in doc:
            _log_hidden(result.model, tensor.name)
        else:
            doc[tensor.name] = _value(tensor)
    return doc


_HIDDEN_LOGGED: set[tuple[str, str]] = set()
_HIDDEN_LOG_MAX = 1024
"""(model, output) pairs already logged as left out of an answer, at most this many."""


def _log_hidden(model: str, output: str) -> None:
    key = (model, output)
    if key in _HIDDEN_LOGGED or len(_HIDDEN_LOGGED) >= _HIDDEN_LOG_MAX:
        return
    _HIDDEN_LOGGED.add(key)
    log.warning(
        "model %r: output %r is left out of generate answers: the answer's field of that "
        "name (the gateway's, or a response parameter) keeps its place, as in Triton",
        model,
        output,
    )


def _value(tensor: Tensor) -> Scalar | list[Any] | orjson.Fragment:
    flat = tensor.to_numpy().reshape(-1)
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        # NaN and infinities as infer writes them (Triton's tokens; orjson would write null),
        # the finite values beside them as doubles, as tolist() gives them below.
        wide = flat.astype(np.float64)
        return non_finite_json(wide.reshape(()) if wide.size == 1 else wide)
    if tensor.datatype == "BYTES":
        # Replaced, not refused as infer's JSON refuses it: generate has no binary form, and
        # a byte-level tokenizer's streamed responses may each hold part of one character.
        values: list[Any] = [b.decode("utf-8", errors="replace") for b in flat]
    else:
        values = flat.tolist()
    return values[0] if len(values) == 1 else values


def sse_event(doc: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``doc``."""
    return b"data: " + encode_json(doc) + b"\n\n"


def sse_events(
    results: AsyncGenerator[InferResult, None], client_id: str | None
) -> AsyncGenerator[bytes, None]:
    """A decoupled model's responses as server-sent events, one per response with data.

    Before the first event an error (a response that carries one, or one raised) is raised,
    for the endpoint to answer with its status; after it, it becomes the last event. The
    responses are taken as they come, up to ``SSE_AHEAD`` events ahead of the client, and
    the events ready together go out as one part (``joined``): sent one part per event, a
    fast model's responses would pile up in the reply reader (``plaza.replies``) while the
    client keeps up."""
    return joined(_events(results, client_id), SSE_AHEAD)


async def _events(
    results: AsyncGenerator[InferResult, None], client_id: str | None
) -> AsyncGenerator[bytes, None]:
    sent = False
    async with aclosing(results):
        try:
            async for result in results:
                if result.error is not None:
                    raise error_from_wire(result.error.code, result.error.message)
                if not result.empty:
                    yield sse_event(generate_response(result, client_id))
                    sent = True
        except PlazaError as exc:
            if not sent:
                raise
            yield sse_event(error_body(exc))  # as an HTTP error's body: job_id included


@dataclass(frozen=True, slots=True)
class _End:
    error: Exception | None = None


async def joined(parts: AsyncGenerator[bytes, None], ahead: int) -> AsyncGenerator[bytes, None]:
    """``parts``, each time joined with the ones that came meanwhile: a task takes them as
    they come (at most ``ahead`` waiting), so their source never waits for the reader of
    this one while there is room. What ``parts`` raises is raised after the parts before
    it; closing this closes ``parts``."""
    ready: asyncio.Queue[bytes | _End] = asyncio.Queue(ahead)

    async def pump() -> None:
        try:
            async for part in parts:
                await ready.put(part)
        except Exception as exc:
            await ready.put(_End(exc))
        else:
            await ready.put(_End())

    task = asyncio.create_task(pump())
    try:
        while True:
            part = bytearray()
            item = await ready.get()
            while isinstance(item, bytes):
                part += item
                if ready.empty():
                    break
                item = ready.get_nowait()
            if part:
                yield bytes(part)
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
    finally:
        await cancel_and_wait([task])
        await parts.aclose()
