"""Reading results from Redis: job submission markers, polling, and result streams.

Workers write (``workers/writer.py``); the gateway and the SDK read through this module.

A decoupled model's job has many responses: its final one under the result key, the ones
before it under their response keys (``Names.response_key``). Polling finds the final one
first; when its ``index`` n is over 0 it reads responses 0..n-1 in one MGET (at most
``MAX_JOB_RESPONSES`` of them: the first ones).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from plaza.codec import decode_result, decode_results, encode_result, entry_count
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import Cancelled, CodecError, error_from_wire
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS, Names
from plaza.settings import RedisSettings

log = logging.getLogger(__name__)

JobState = Literal["pending", "done", "unknown"]

MAX_JOB_RESPONSES = 4096
"""The most responses before its final one that polling a decoupled model's job reads (the
first ones); ``JobStatus.missing`` counts the rest."""


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What polling a job id found."""

    state: JobState
    result: InferResult | None = None
    """The final result (for an ordinary model's job, its only one)."""
    responses: tuple[InferResult, ...] = ()
    """Every response of a done job, in order: the final result last, unless it is
    ``empty`` (a decoupled model that closed its request without data), then left out.
    An ordinary job's is ``(result,)``."""
    missing: int = 0
    """Responses before the final one that were not read: past ``MAX_JOB_RESPONSES``, or
    expired (each lives ``redis.result_ttl_s`` from its own write, so the first ones of a
    long stream go first)."""
    decoupled: bool | None = None
    """Whether the job's model was decoupled when the job was submitted, as its marker
    says; None where the marker does not say (the submitter knew no config for it, or the
    marker is gone or older than this field)."""


class ResultStore:
    """Result keys and job markers of one deployment (its key prefix)."""

    def __init__(self, redis: aioredis.Redis, settings: RedisSettings, names: Names) -> None:
        self._redis = redis
        self._settings = settings
        self._names = names

    async def mark_submitted(
        self, correlation_id: str, model: str, *, ttl_s: int, decoupled: bool | None = None
    ) -> None:
        """Remember that a job exists, so polling can tell pending from unknown; ``ttl_s``
        must outlive the job's time in the queue plus the result TTL (``plaza.producer``).
        The marker holds the model's name, and whether it is decoupled where that is known
        (``decoupled``), so that a poll reads a decoupled job's single response as one of
        many even where the model is no longer loaded."""
        value = model if decoupled is None else f"{model} {int(decoupled)}"
        await self._redis.set(self._names.job_key(correlation_id), value.encode(), ex=ttl_s)

    async def cancel(self, req: InferRequest) -> bool:
        """Store a ``cancelled`` answer for ``req`` unless it has an answer already (first
        write wins, as a worker's); True when it was stored. A worker that fetches the
        request later finds the answer and skips it (``workers/answered.py``)."""
        err = Cancelled("the caller cancelled the request before it was answered")
        result = InferResult(req.id, req.model, req.version, error=ErrorInfo(err.code, err.message))
        stored = await self._redis.set(
            self._names.result_key(req.id),
            encode_result(result),
            nx=True,
            ex=self._settings.result_ttl_s,
        )
        return bool(stored)

    async def poll(self, correlation_id: str) -> JobStatus:
        """done (with the result), pending (submitted, no result yet) or unknown."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._names.result_key(correlation_id))
        pipe.get(self._names.job_key(correlation_id))
        raw, marker = await pipe.execute()
        if raw is None:
            return JobStatus("pending" if marker is not None else "unknown")
        decoupled = marked_decoupled(marker)
        final = decode_result(raw)
        if final.index == 0:
            return JobStatus("done", final, () if final.empty else (final,), decoupled=decoupled)
        return await self._with_responses(final, decoupled)

    async def _with_responses(self, final: InferResult, decoupled: bool | None) -> JobStatus:
        """A decoupled job's status: its responses before ``final`` read in one MGET."""
        count = min(final.index, MAX_JOB_RESPONSES)
        keys = [self._names.response_key(final.id, i) for i in range(count)]
        stored: list[Any] = await self._redis.mget(keys)
        found = [decode_result(raw) for raw in stored if raw is not None]
        responses = (*found, final) if not final.empty else tuple(found)
        missing = final.index - len(found)
        return JobStatus("done", final, responses, missing=missing, decoupled=decoupled)


def marked_decoupled(marker: bytes | None) -> bool | None:
    """What a job marker (``ResultStore.mark_submitted``) says of its model's being
    decoupled: None where it says nothing (a name alone, or no marker)."""
    if marker is None:
        return None
    _, sep, flag = marker.partition(b" ")
    return flag == b"1" if sep else None


def raise_for_error(result: InferResult) -> InferResult:
    """The result itself, or its error raised as the matching PlazaError subclass."""
    if result.error is not None:
        raise error_from_wire(result.error.code, result.error.message)
    return result


async def ensure_group(redis: aioredis.Redis, stream: str, group: str) -> None:
    """Create a consumer group on ``stream`` (and the stream), reading from the start."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def consume_stream(
    redis: aioredis.Redis,
    stream: str,
    group: str,
    consumer: str,
    *,
    count: int = 64,
    block_ms: int = 1000,
    idle_exit: bool = False,
    keep_alive_s: int | None = None,
) -> AsyncIterator[tuple[bytes, list[InferResult]]]:
    """Yield (entry id, results) from ``stream`` as one consumer of ``group``.

    The caller acknowledges each entry once it has processed it (``ack_entry``), so a
    consumer that crashes mid-entry gets it again: its own pending entries are delivered
    first when it comes back, each once per call (another consumer can also take them with
    XAUTOCLAIM). An entry that cannot be delivered is acknowledged here, logged and skipped,
    so that it never stops the entries behind it: one trimmed away (MAXLEN) while it was
    pending, whose results are gone from the stream but still under their result keys
    (``ResultStore.poll``) for ``redis.result_ttl_s`` after their write; and one whose
    results do not decode (CodecError), left in the stream (XRANGE) until trimmed.
    ``idle_exit`` stops after a block_ms wait that brought nothing (for batch pipelines
    that drain and finish). ``keep_alive_s``: the stream's idle expiry, renewed while this
    consumer reads (workers renew it on every write), so a stream outlives neither its
    writers nor its readers by more than that.
    """
    await ensure_group(redis, stream, group)
    start: bytes | str = "0"  # first our own pending entries (after this id), then new ones
    renewed = -math.inf
    while True:
        now = time.monotonic()
        if keep_alive_s is not None and now - renewed > keep_alive_s / 3:
            await redis.expire(stream, keep_alive_s)
            renewed = now
        reply: Any = await redis.xreadgroup(
            group, consumer, {stream: start}, count=count, block=block_ms
        )
        entries = reply[0][1] if reply else []
        if not entries:
            if start != ">":
                start = ">"
                continue
            if idle_exit:
                return
            continue
        if start != ">":  # pending ones: read on after the last, acknowledged or not
            start = entries[-1][0]
        for entry_id, fields in entries:
            results = await _entry_results(redis, stream, group, entry_id, fields)
            if results is not None:
                yield entry_id, results


async def _entry_results(
    redis: aioredis.Redis, stream: str, group: str, entry_id: bytes, fields: Any
) -> list[InferResult] | None:
    """A stream entry's results; None for one that has none to give, acknowledged here
    (as ``consume_stream`` says) so that no consumer of the group reads it again."""
    if not fields:  # XREADGROUP gives a pending entry that MAXLEN trimmed no fields
        log.warning(
            "result stream %s: pending entry %s was trimmed before it was acknowledged; "
            "acknowledged and skipped (its results are still under their result keys "
            "until they expire)",
            stream,
            _text(entry_id),
        )
        await ack_entry(redis, stream, group, entry_id)
        return None
    try:
        packed = fields.get(STREAM_FIELD_RESULTS)
        if packed is None:
            raise CodecError("the entry has no results field")
        return decode_results(packed, entry_count(fields.get(STREAM_FIELD_COUNT)))
    except CodecError as exc:
        log.error(
            "undecodable result entry %s on %s, acknowledged and skipped: %s",
            _text(entry_id),
            stream,
            exc,
        )
        await ack_entry(redis, stream, group, entry_id)
        return None


def _text(entry_id: bytes | str) -> str:
    """A stream entry id as text, for a log line."""
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


async def ack_entry(redis: aioredis.Redis, stream: str, group: str, entry_id: bytes) -> None:
    """Acknowledge one processed stream entry (XACK)."""
    await redis.xack(stream, group, entry_id)
