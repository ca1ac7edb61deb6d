"""Triton's ``reshape``: a model that takes an input, or makes an output, in another shape than
the one clients send and get.

config.pbtxt's ``dims`` is the shape on the wire (past the batch dim when the model
batches); a tensor's ``reshape { shape: [...] }`` is the shape the model sees. An input is
reshaped from ``dims`` to ``reshape`` before the model runs, an output from ``reshape`` back
to ``dims`` after it, row by row: the batch dim stays, and only the shape changes (a
tensor's bytes are in C order, so the data is not touched). The usual case is a model whose
batched input is ``[batch]``: clients send ``[batch, 1]`` (``dims: [ 1 ]``, ``reshape: {
shape: [ ] }``).

A target shape may hold one -1, filled in from the element count; the config checks
(``plaza.modelconfig``) make sure that what can be known before a request is consistent,
and ``validate_request`` refuses a request whose element count cannot be reshaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from plaza.tensors import Tensor

Shape = tuple[int, ...]


class Reshaped(Protocol):
    """A configured tensor, as far as reshaping goes (``plaza.modelconfig.TensorSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def dims(self) -> Shape: ...
    @property
    def reshape(self) -> Shape | None: ...


def fill(target: Shape, elements: int) -> Shape | None:
    """``target`` with its -1 (at most one) filled in so that it holds ``elements``; None
    when no such shape exists."""
    fixed = math.prod(d for d in target if d != -1)
    if -1 not in target:
        return target if fixed == elements else None
    if fixed == 0 or elements % fixed:
        return None
    return tuple(elements // fixed if d == -1 else d for d in target)


def reshape(shape: Shape, target: Shape, batched: bool) -> Shape | None:
    """A tensor of ``shape`` in ``target``'s shape (the batch dim kept when ``batched``), or
    None when its elements do not fit."""
    if not batched:
        return fill(target, math.prod(shape))
    if not shape:
        return None
    rows = shape[0]
    inner = fill(target, math.prod(shape[1:]))
    return None if inner is None else (rows, *inner)


def consistent(origin: Shape, target: Shape) -> str | None:
    """Why a tensor of ``origin`` can never be reshaped to ``target``, or None when it can
    (always, or for some requests: a -1 in ``origin`` is settled per request)."""
    if sum(d == -1 for d in target) > 1:
        return f"{list(target)} may hold one -1 at most"
    if -1 in origin:
        return None
    elements = math.prod(origin)
    if fill(target, elements) is None:
        return f"{list(target)} cannot hold the {elements} elements of {list(origin)}"
    return None


def to_model(inputs: Iterable[Reshaped]) -> dict[str, Shape]:
    """The inputs that have a reshape: name -> the model's shape."""
    return {t.name: t.reshape for t in inputs if t.reshape is not None}


def to_client(outputs: Iterable[Reshaped]) -> dict[str, Shape]:
    """The outputs that have a reshape: name -> the clients' shape (``dims``)."""
    return {t.name: t.dims for t in outputs if t.reshape is not None}


def _shape_for(name: str, shape: Shape, target: Shape, batched: bool) -> Shape:
    new = reshape(shape, target, batched)
    if new is None:
        raise ValueError(
            f"tensor {name!r} of shape {list(shape)} cannot be reshaped to {list(target)} "
            "(config.pbtxt reshape)"
        )
    return new


def arrays(named: Mapping[str, Any], targets: Mapping[str, Shape], batched: bool) -> dict[str, Any]:
    """``named`` arrays, those in ``targets`` reshaped to theirs (views: no copy); ValueError
    for one that does not fit."""
    out = dict(named)
    for name, target in targets.items():
        if name in out:
            out[name] = out[name].reshape(_shape_for(name, out[name].shape, target, batched))
    return out


def tensors(
    items: Iterable[Tensor], targets: Mapping[str, Shape], batched: bool
) -> tuple[Tensor, ...]:
    """``items``, those named in ``targets`` with their shape changed to it (the bytes are
    the same); ValueError for one that does not fit."""
    return tuple(
        msgspec.structs.replace(t, shape=_shape_for(t.name, t.shape, targets[t.name], batched))
        if t.name in targets
        else t
        for t in items
    )
