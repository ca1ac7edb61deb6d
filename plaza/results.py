"""Reading results from Redis: job submission markers, polling, and result streams.

Workers write (``workers/writer.py``); the gateway and the SDK read through this module.

A decoupled model's job has many responses: its final one under the result key, the ones
before it under their response keys (``Names.response_key``). Polling finds the final one
first; when its ``index`` n is over 0 it reads responses 0..n-1 in one MGET (at most
``MAX_JOB_RESPONSES`` of them: the first ones).

A job marker (``ResultStore.mark_submitted``) says that a job exists, of which model, and
how its submitter asked for its answer (``JobView``); polling reads it with the result.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from plaza.codec import decode_result, decode_results, encode_result, entry_count
from plaza.connections import keyed_command
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import Cancelled, CodecError, error_from_wire
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS, Names
from plaza.settings import RedisSettings

log = logging.getLogger(__name__)

JobState = Literal["pending", "done", "unknown"]

MAX_JOB_RESPONSES = 4096
"""The most responses before its final one that polling a decoupled model's job reads (the
first ones); ``JobStatus.missing`` counts the rest."""

_STEP_ID = re.compile(r"\.[0-9]+\Z")
"""The end of an ensemble step's correlation id (``plaza.naming.step_request_id``)."""


@dataclass(frozen=True, slots=True)
class JobView:
    """How a job's done answer is rendered, as its request asked; the job marker keeps it
    (the gateway's KServe v2 front writes it; a marker without one renders the default)."""

    client_id: str | None = None
    """The request's ``id``: the client's label, echoed as the answer's ``id``."""
    binary_output: bool = False
    """The request's ``binary_data_output``: outputs are binary unless they say otherwise."""
    outputs: dict[str, bool] = field(default_factory=dict)
    """Each requested output's own ``binary_data``, where it gave one."""

    def wants_binary(self, name: str, asked: bool = False) -> bool:
        """Whether output ``name`` is answered binary: as the output said, else as the
        request said, or ``asked`` (the poll's own ``binary_data_output``)."""
        own = self.outputs.get(name)
        return own if own is not None else self.binary_output or asked

    def encode(self) -> bytes:
        """The view as the marker keeps it (JSON; empty for the default view)."""
        doc: dict[str, Any] = {}
        if self.client_id is not None:
            doc["id"] = self.client_id
        if self.binary_output:
            doc["binary_data_output"] = True
        if self.outputs:
            doc["binary_data"] = self.outputs
        return orjson.dumps(doc) if doc else b""

    @classmethod
    def decode(cls, raw: bytes) -> JobView:
        """A view ``encode`` wrote; the default view for one that does not read."""
        try:
            doc = orjson.loads(raw)
            client_id = doc.get("id")
            outputs = {str(k): bool(v) for k, v in doc.get("binary_data", {}).items()}
            binary = bool(doc.get("binary_data_output", False))
        except (orjson.JSONDecodeError, AttributeError) as exc:
            log.warning("a job marker's view does not read (%s); rendering the default", exc)
            return cls()
        return cls(client_id if isinstance(client_id, str) else None, binary, outputs)


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
    view: JobView = JobView()
    """How its answer is rendered, as its marker says (the default where it says nothing,
    or where the marker is missing)."""
    marked: bool = False
    """Whether a job marker was found with the result (a job's, as submitted)."""


class ResultStore:
    """Result keys and job markers of one deployment (its key prefix)."""

    def __init__(self, redis: aioredis.Redis, settings: RedisSettings, names: Names) -> None:
        self._redis = redis
        self._settings = settings
        self._names = names

    async def mark_submitted(
        self,
        correlation_id: str,
        model: str,
        *,
        ttl_s: int,
        decoupled: bool | None = None,
        view: JobView | None = None,
    ) -> None:
        """Remember that a job exists, so polling can tell pending from unknown; ``ttl_s``
        must outlive the job's time in the queue plus the result TTL (``plaza.producer``).
        The marker holds the model's name, and whether it is decoupled where that is known
        (``decoupled``), so that a poll reads a decoupled job's single response as one of
        many even where the model is no longer loaded; then the ``view`` of its answer."""
        await self._redis.set(
            self._names.job_key(correlation_id), marker_value(model, decoupled, view), ex=ttl_s
        )

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
        """done (with the result), pending (submitted, no result yet) or unknown.

        The result key alone answers for an id with no marker (a sync call's, a job whose
        marker write failed, an ensemble step's: ``step_answer`` tells that last one)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(self._names.result_key(correlation_id))
        pipe.get(self._names.job_key(correlation_id))
        raw, marker = await pipe.execute()
        if raw is None:
            return JobStatus("pending" if marker is not None else "unknown")
        decoupled, view = read_marker(marker)
        final = decode_result(raw)
        marked = marker is not None
        if final.index == 0:
            responses = () if final.empty else (final,)
            return JobStatus(
                "done", final, responses, decoupled=decoupled, view=view, marked=marked
            )
        return await self._with_responses(final, decoupled, view, marked)

    async def _with_responses(
        self, final: InferResult, decoupled: bool | None, view: JobView, marked: bool
    ) -> JobStatus:
        """A decoupled job's status: its responses before ``final`` read in one MGET."""
        count = min(final.index, MAX_JOB_RESPONSES)
        keys = [self._names.response_key(final.id, i) for i in range(count)]
        stored: list[Any] = await self._redis.mget(keys)
        found = [decode_result(raw) for raw in stored if raw is not None]
        responses = (*found, final) if not final.empty else tuple(found)
        missing = final.index - len(found)
        return JobStatus(
            "done", final, responses, missing, decoupled=decoupled, view=view, marked=marked
        )


def step_answer(correlation_id: str, status: JobStatus) -> bool:
    """Whether ``status`` is an ensemble step's answer polled by its step id (``<id>.<n>``,
    ``plaza.naming.step_request_id``) that no job marker names: the ensemble's business,
    never a job (the gateway answers job_not_found)."""
    return status.state == "done" and not status.marked and bool(_STEP_ID.search(correlation_id))


def marker_value(model: str, decoupled: bool | None, view: JobView | None = None) -> bytes:
    """A job marker: ``<model>``, then `` 0`` or `` 1`` where ``decoupled`` is known (``-``
    where it is not and a view follows), then `` <view>`` where the view is not the default."""
    flag = {None: b"-", False: b"0", True: b"1"}[decoupled]
    shown = b"" if view is None else view.encode()
    if shown:
        return b" ".join([model.encode(), flag, shown])
    return model.encode() if decoupled is None else b" ".join([model.encode(), flag])


def read_marker(marker: bytes | None) -> tuple[bool | None, JobView]:
    """What a job marker (``marker_value``) says: whether its model is decoupled (None where
    it says nothing: a name alone, ``-``, or no marker) and the view of the job's answer."""
    if marker is None:
        return None, JobView()
    parts = marker.split(b" ", 2)
    flag = parts[1] if len(parts) > 1 else b""
    decoupled = {b"0": False, b"1": True}.get(flag)
    return decoupled, JobView.decode(parts[2]) if len(parts) > 2 else JobView()


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
        try:
            reply: Any = await keyed_command(
                redis, stream,
                "XREADGROUP", "GROUP", group, consumer, "COUNT", count, "BLOCK", block_ms,
                "STREAMS", stream, start,
            )  # fmt: skip
        except ResponseError as exc:
            if not str(exc).startswith("NOGROUP"):
                raise
            await _group_again(redis, stream, group)
            start, renewed = "0", -math.inf
            continue
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


async def _group_again(redis: aioredis.Redis, stream: str, group: str) -> None:
    """Make ``group`` (and ``stream``) again: Redis lost them (restarted without its data,
    the stream expired or was evicted). What the stream held then is gone from it."""
    log.warning(
        "result stream %s: consumer group %s is gone (Redis restarted empty, or the "
        "stream expired or was evicted); made again. Entries written before may have "
        "been lost with it (their results stay under their result keys if those survived)",
        stream,
        group,
    )
    await ensure_group(redis, stream, group)


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
