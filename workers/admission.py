"""Admission: turn one Kafka record into a WorkItem, an error answer, or a dead letter.

Each record is judged on its own, so one bad request never harms its batch-mates:
- decodes and fits the model -> ``WorkItem`` for the batcher;
- decodes far enough to know its correlation id, but is invalid -> ``Rejected`` (an error
  result with a stable code, written like any result);
- cannot even be read (not msgpack, no correlation id) -> ``DeadLetter`` (copied to the
  model's dead-letter topic with the reason in headers).

``admit`` never raises: an exception it did not foresee (a bug, MemoryError) still becomes
an error answer or a dead letter, because a record that kills the intake would kill every
worker that takes its partition next. A reply stream outside the deployment's prefixes is
refused (answered on the result key only), so producers cannot make workers write streams
at arbitrary keys.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import NamedTuple

from aiokafka.structs import TopicPartition

from plaza.codec import decode_request, peek_reply
from plaza.contract import InferRequest, InferResult
from plaza.errors import CodecError, InvalidInput, ModelNotFound, PayloadTooLarge, PlazaError
from plaza.modelconfig import ModelSpec
from plaza.naming import Names
from plaza.priority import settle_level
from plaza.validation import validate_request
from plaza.workers.runner import NO_PARTITION, WorkItem, error_result


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


class Source(NamedTuple):
    """Where and when a record was taken in."""

    partition: TopicPartition
    offset: int
    received: float
    """Monotonic time (queue time starts here)."""


def resolve_version(req: InferRequest, spec: ModelSpec, versions: list[int]) -> int:
    """The served version a request asks for ("" -> the newest served)."""
    if req.model != spec.name:
        raise ModelNotFound(f"this worker serves {spec.name!r}, not {req.model!r}")
    if not req.version:
        return max(versions)
    if req.version.isascii() and req.version.isdigit() and int(req.version) in versions:
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
    names: Names,
    worker_id: str = "",
    now: float | None = None,
    partition: TopicPartition = NO_PARTITION,
    offset: int = -1,
) -> Admission:
    """Judge one record's value (from ``partition`` at ``offset``); never raises."""
    if value is None:
        return DeadLetter(CodecError("record has no value"))
    source = Source(partition, offset, time.monotonic() if now is None else now)
    try:
        return _judge(value, spec, versions, max_bytes, names, worker_id, source)
    except Exception as exc:  # never let one record stop the intake (see the module doc)
        return _unforeseen(value, exc, spec, worker_id)


def _judge(
    value: bytes,
    spec: ModelSpec,
    versions: list[int],
    max_bytes: int,
    names: Names,
    worker_id: str,
    source: Source,
) -> Admission:
    if len(value) > max_bytes:
        err: PlazaError = PayloadTooLarge(f"request is {len(value)} bytes; limit {max_bytes}")
        return _reject_or_dead(value, err, spec, names, worker_id)
    try:
        req = decode_request(value)
    except CodecError as exc:
        return _reject_or_dead(value, exc, spec, names, worker_id)
    stream = req.reply.stream
    if stream is not None and not _allowed_stream(names, stream):
        return Rejected(error_result(req, _bad_stream(stream, names), worker=worker_id), None)
    try:
        version = resolve_version(req, spec, versions)
        rows = validate_request(req, spec)
        # A negative priority is refused here, where it is answered: the worker settles the
        # level later, on paths (a redelivered record's) that must never meet a bad one.
        settle_level(req.priority, 0, 0)
    except PlazaError as exc:
        return Rejected(error_result(req, exc, worker=worker_id), stream)
    return WorkItem(
        request=req,
        rows=rows,
        version=version,
        received=source.received,
        partition=source.partition,
        offset=source.offset,
    )


@functools.lru_cache(maxsize=1024)
def _allowed_stream(names: Names, stream: str) -> bool:
    """``names.is_reply_stream``, remembered: a deployment's requests name a few reply
    streams (one per gateway, one per results stream), and every record asks."""
    return names.is_reply_stream(stream)


def _unforeseen(value: bytes, exc: Exception, spec: ModelSpec, worker_id: str) -> Admission:
    """An exception nothing foresaw: answer it on the result key alone (the reply stream is
    unchecked), or dead-letter it when even the id cannot be read."""
    err = InvalidInput(f"request could not be admitted: {type(exc).__name__}: {exc}")
    rid, _ = peek_reply(value)  # never raises
    if rid is None:
        return DeadLetter(err)
    return Rejected(error_result(None, err, rid=rid, model=spec.name, worker=worker_id), None)


def _bad_stream(stream: str, names: Names) -> InvalidInput:
    allowed = " or ".join(f"'{p}<name>'" for p in names.reply_stream_prefixes())
    return InvalidInput(f"reply_stream {stream[:200]!r} is not allowed: it must be {allowed}")


def _reject_or_dead(
    value: bytes, err: PlazaError, spec: ModelSpec, names: Names, worker_id: str
) -> Admission:
    rid, stream = peek_reply(value)
    if rid is None:
        return DeadLetter(err)
    if stream is not None and not names.is_reply_stream(stream):
        stream = None  # answered on its result key only
    return Rejected(error_result(None, err, rid=rid, model=spec.name, worker=worker_id), stream)


def monotonic_deadline(req: InferRequest, now_mono: float, now_wall: float) -> float | None:
    """The request's absolute deadline (epoch ms) as a monotonic time, or None."""
    if req.deadline_ms is None:
        return None
    return now_mono + (req.deadline_ms / 1000.0 - now_wall)


def wait_began(req: InferRequest, now_mono: float, now_wall: float, max_wait_s: float) -> float:
    """When ``req``'s wait for batch-mates began, as a monotonic time: the moment it was sent
    (``sent_us``), read onto this clock, but never more than ``max_wait_s`` (the model's
    queue delay) before ``now_mono``, nor after it. So a producer whose clock runs ahead
    (or a request without ``sent_us``) waits as if just sent, and one whose clock lags, or
    a request that sat in Kafka longer than the delay, is due at once."""
    if req.sent_us <= 0:
        return now_mono
    waited = now_wall - req.sent_us / 1e6
    return now_mono - min(max(waited, 0.0), max_wait_s)
