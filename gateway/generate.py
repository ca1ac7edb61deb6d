"""Triton's generate extension: a text-first JSON body for a model, over HTTP only.

``POST /v2/models/{model}[/versions/{version}]/generate`` (and ``generate_stream``) take one
JSON object. Each of the model's inputs is a top-level key of its own name, whose value is a
JSON scalar (a string for BYTES) or a list, nested or flat; ``parameters`` is an object of
scalars; ``id`` is the client's label; any other top-level key with a scalar value is a
parameter too (Triton: extra properties are "passed either as parameters or tensors based
on model specification"). An input takes the model's dims: a nested list of that shape, or
values that fill its fixed dims and at most one variable one; a batching model gets a batch
of one. The answer is one object: ``model_name``, ``model_version``, ``id`` when given, the
response's parameters (a Python model's ``InferenceResponse(parameters=...)``) by their
names, as Triton's generate answers them, and each output by its name: its one value, or a
flat list of its values (BYTES as text). Float values may be ``NaN``, ``Infinity`` or
``-Infinity``, both ways, read and written by the infer body's own code
(``plaza.gateway.kserve``: ``load_json_object``, ``non_finite_json``).

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
    shape = _shape(spec, value)
    data = value if isinstance(value, list) else [value]
    return json_tensor(spec.name, spec.datatype, (1, *shape) if batched else shape, {"data": data})


def _shape(spec: TensorSpec, value: Any) -> tuple[int, ...]:
    """The shape ``value`` takes in ``spec``'s dims: its own nesting where that fits them,
    else its element count spread over the dims (one variable dim takes the rest)."""
    nested = _nesting(spec.name, value)
    dims = spec.dims
    if len(nested) == len(dims) and all(d in (-1, n) for d, n in zip(dims, nested, strict=True)):
        return nested
    count = math.prod(nested)
    fixed = math.prod(d for d in dims if d != -1)
    free = sum(1 for d in dims if d == -1)
    if (free == 0 and fixed == count) or (free == 1 and fixed and count % fixed == 0):
        return tuple(count // fixed if d == -1 else d for d in dims)
    raise InvalidInput(
        f"input {spec.name!r}: {count} values do not fit its dims {list(dims)}", tensor=spec.name
    )


def _nesting(name: str, value: Any) -> tuple[int, ...]:
    """The shape of nested lists, read down their first items (a scalar: ``()``); ragged
    lists are found when the values are counted against it (``json_tensor``)."""
    shape: list[int] = []
    while isinstance(value, list):
        if len(shape) >= MAX_NESTING:
            raise InvalidInput(
                f"input {name!r}: nested deeper than {MAX_NESTING} lists", tensor=name
            )
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return tuple(shape)


def generate_response(result: InferResult, client_id: str | None) -> dict[str, Any]:
    """The answer's JSON object: the model, the response's parameters and each output by
    name. As in Triton, a parameter never replaces ``model_name``, ``model_version`` or
    ``id``, and an output never replaces a parameter of its name."""
    doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version}
    if client_id is not None:
        doc["id"] = client_id
    params = result.parameters
    for key, value in params.items():
        doc.setdefault(key, value)
    for tensor in result.outputs:
        if tensor.name not in params:
            doc[tensor.name] = _value(tensor)
    return doc


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
