"""Admission: turn one Kafka record into a WorkItem, an error answer, or a dead letter.

Each record is judged on its own, so one bad request never harms its batch-mates:
- decodes and fits the model -> ``WorkItem`` for the batcher;
- decodes far enough to know its correlation id, but is invalid -> ``Rejected`` (an error
  result with a stable code, written like any result);
- cannot even be read (not msgpack, no correlation id) -> ``DeadLetter`` (copied to the
  model's dead-letter topic with the reason in headers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from plaza.codec import decode_request, peek_reply
from plaza.contract import InferRequest, InferResult
from plaza.errors import CodecError, ModelNotFound, PayloadTooLarge, PlazaError
from plaza.modelconfig import ModelSpec
from plaza.validation import validate_request
from plaza.workers.runner import WorkItem, error_result


@dataclass(frozen=True, slots=True)
class Rejected:
    """An invalid request whose id is known: answer it with ``result``."""

    result: InferResult
    reply_stream: str | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that cannot be answered: park it with its reason."""

    error: PlazaError


Admission = WorkItem | Rejected | DeadLetter


def resolve_version(req: InferRequest, spec: ModelSpec, versions: list[int]) -> int:
    """The served version a request asks for ("" -> the newest served)."""
    if req.model != spec.name:
        raise ModelNotFound(f"this worker serves {spec.name!r}, not {req.model!r}")
    if not req.version:
        return max(versions)
    if req.version.isdigit() and int(req.version) in versions:
        return int(req.version)
    raise ModelNotFound(
        f"model {spec.name!r} has no served version {req.version!r} (served: {versions})"
    )


def admit(
    value: bytes | None,
    spec: ModelSpec,
    versions: list[int],
    *,
    max_bytes: int,
    worker_id: str = "",
    now: float | None = None,
) -> Admission:
    """Judge one record's value; never raises for bad input."""
    if value is None:
        return DeadLetter(CodecError("record has no value"))
    if len(value) > max_bytes:
        err: PlazaError = PayloadTooLarge(f"request is {len(value)} bytes; limit {max_bytes}")
        return _reject_or_dead(value, err, spec, worker_id)
    try:
        req = decode_request(value)
    except CodecError as exc:
        return _reject_or_dead(value, exc, spec, worker_id)
    try:
        version = resolve_version(req, spec, versions)
        rows = validate_request(req, spec)
    except PlazaError as exc:
        return Rejected(error_result(req, exc, worker=worker_id), req.reply.stream)
    received = time.monotonic() if now is None else now
    return WorkItem(request=req, rows=rows, version=version, received=received)


def _reject_or_dead(value: bytes, err: PlazaError, spec: ModelSpec, worker_id: str) -> Admission:
    rid, stream = peek_reply(value)
    if rid is None:
        return DeadLetter(err)
    return Rejected(error_result(None, err, rid=rid, model=spec.name, worker=worker_id), stream)


def monotonic_deadline(req: InferRequest, now_mono: float, now_wall: float) -> float | None:
    """The request's absolute deadline (epoch ms) as a monotonic time, or None."""
    if req.deadline_ms is None:
        return None
    return now_mono + (req.deadline_ms / 1000.0 - now_wall)
