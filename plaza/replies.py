"""The reply multiplexer: one Redis reader per process, results routed by correlation id.

A gateway (or an SDK client) owns one reply stream. Waiting requests register a future
under their correlation id before they publish; a single ``XREAD BLOCK`` loop reads the
stream and resolves the futures. No connection or task per waiting request: the loop
reads on a connection of its own (``plaza.resp_channel``; redis-py's client on a Redis
Cluster).

A decoupled model answers one request many times (``InferResult.index``, ``final``). Its
caller registers a ``ResponseStream`` instead (``expect_responses``): every result of its
id goes there, in order, until the final one. The read loop never waits for a slow reader,
so a stream is bounded instead: it may hold at most ``limit`` responses that its reader
has not taken after the reader had its turn. The loop hands an entry's results over
whole; once an entry takes a stream past ``limit``, the loop stops handing over the rest of
that read and reads again from there, which gives every reader a turn (the event loop runs
them while the read waits for Redis). A stream still past ``limit`` at that next read ends
with QueueFull (its reader gets the responses it holds, then the error). A reader that
takes what came on its turn is therefore never cut off, however many responses one entry
carries, and a stream never holds more than ``limit`` plus one entry's worth (a worker
puts at most ``MAX_ENTRY_RESPONSES`` of one request in an entry, ``workers/writer.py``). A
future waits for a request's final result only: a response that is not final (there are
none for an ordinary model) leaves it waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from plaza.codec import decode_results, entry_count
from plaza.connections import keyed_command
from plaza.contract import InferResult
from plaza.errors import CodecError, PlazaError, QueueFull, Unavailable
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.resp_channel import channel_for
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READ_GRACE_S = 10.0
"""How long past its ``BLOCK`` a read may take before the connection counts as dead."""

MAX_PENDING_RESPONSES = 1024
"""Responses of one request a ``ResponseStream`` may hold for its reader by default after
the reader had its turn; more ends the stream with QueueFull (the reader is too slow for
the model)."""


def _field(flat: list[bytes], name: bytes) -> bytes | None:
    """A stream entry's field ``name`` from its flat [field, value, ...] list."""
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == name:
            return flat[i + 1]
    return None


class ResponseStream:
    """Every result of one request, in order, until its final one: ``async for`` over it.

    Fed by the reply reader (``deliver``, never blocking); ends after the final result, or
    with the error that ended it (QueueFull when more than ``limit`` responses are still
    waiting at ``check_limit``, Unavailable when the reader stops), raised once the
    responses before it are taken. A response whose index was delivered already (a
    duplicate) is dropped.
    """

    def __init__(
        self,
        correlation_id: str,
        limit: int,
        on_end: Callable[[ResponseStream], None],
        on_over: Callable[[ResponseStream], None] | None = None,
    ) -> None:
        """``on_over`` is called when a delivery takes the stream past ``limit``: its
        reader must have a turn before ``check_limit`` judges it."""
        self.correlation_id = correlation_id
        self.limit = limit
        self._on_end = on_end
        self._on_over = on_over
        self._buffer: deque[InferResult] = deque()
        self._next_index = 0
        self._finished = False
        self._error: PlazaError | None = None
        self._ready = asyncio.Event()

    @property
    def ended(self) -> bool:
        """The final result (or an error) came: nothing more will be delivered."""
        return self._finished or self._error is not None

    @property
    def over_limit(self) -> bool:
        """More than ``limit`` responses wait for the reader."""
        return len(self._buffer) > self.limit

    def deliver(self, result: InferResult) -> None:
        """Take ``result`` for the reader (the reply reader calls this)."""
        if self.ended or result.index < self._next_index:
            return
        self._buffer.append(result)
        self._next_index = result.index + 1
        if result.final:
            self._finished = True
            self._on_end(self)
        elif len(self._buffer) == self.limit + 1 and self._on_over is not None:
            self._on_over(self)
        self._ready.set()

    def check_limit(self) -> None:
        """End the stream with QueueFull if more than ``limit`` responses still wait (the
        reply reader calls this once the reader had a turn to take them)."""
        if self.ended or not self.over_limit:
            return
        self.fail(
            QueueFull(
                f"request {self.correlation_id}: {len(self._buffer)} responses waited "
                f"undelivered, more than its limit of {self.limit} (the caller reads them "
                "more slowly than the model answers); the rest are dropped",
                limit=self.limit,
            )
        )

    def fail(self, error: PlazaError) -> None:
        """End the stream with ``error`` (after the responses it holds)."""
        if self.ended:
            return
        self._error = error
        self._on_end(self)
        self._ready.set()

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> InferResult:
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._finished:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._buffer.popleft()


def _stopped() -> Unavailable:
    """What a caller still waiting when the reader stops gets (one each: an exception
    raised in many tasks would gather all their tracebacks)."""
    return Unavailable("the reply stream's reader stopped before the answer came")


class ReplyMux:
    """Reads ``stream`` and completes ``wait`` futures by correlation id."""

    def __init__(self, redis: aioredis.Redis, stream: str, *, ttl_s: int, maxlen: int) -> None:
        self.stream = stream
        self._redis = redis
        self._channel = channel_for(redis)
        self._ttl_s = ttl_s
        self._maxlen = maxlen
        self._waiters: dict[str, asyncio.Future[InferResult]] = {}
        self._streams: dict[str, ResponseStream] = {}
        self._over: list[ResponseStream] = []
        """Streams a delivery took past their limit, judged at the next read."""
        self._task: asyncio.Task[None] | None = None
        self._last_id = b"0-0"
        self._block_ms = 500
        self._closing = False
        self.healthy = False

    async def start(self) -> None:
        await self._touch()
        self._task = asyncio.create_task(self._read_loop(), name=f"replies:{self.stream}")

    async def stop(self) -> None:
        # Let the blocking XREAD return by itself (at most block_ms): cancelling a task in
        # the middle of a redis.asyncio read can leave it stuck on the connection.
        self._closing = True
        if self._task:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self._block_ms / 1000 + 5)
            except TimeoutError:
                await cancel_and_wait([self._task])
            except asyncio.CancelledError:
                pass
        if self._channel is not None:
            await self._channel.close()
        # The callers still waiting were not cancelled: they are told why their wait ended
        # (a CancelledError would read as their own cancellation, and store a cancel).
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(_stopped())
        self._waiters.clear()
        for stream in list(self._streams.values()):
            stream.fail(_stopped())
        self._streams.clear()
        with contextlib.suppress(Exception):
            await self._redis.delete(self.stream)

    @property
    def waiting(self) -> int:
        return len(self._waiters) + len(self._streams)

    def expect(self, correlation_id: str) -> asyncio.Future[InferResult]:
        """Register interest before publishing; await the future for the (final) result."""
        fut: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        self._waiters[correlation_id] = fut
        return fut

    def expect_responses(
        self, correlation_id: str, limit: int = MAX_PENDING_RESPONSES
    ) -> ResponseStream:
        """Register interest in every response of a request before publishing it (a
        decoupled model's); ``async for`` over the stream until its final result. It holds
        at most ``limit`` responses its reader has not taken once it had its turn
        (``ResponseStream``)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        stream = ResponseStream(correlation_id, limit, self._end_stream, self._past_limit)
        self._streams[correlation_id] = stream
        return stream

    def forget(self, correlation_id: str) -> None:
        """Drop a waiter (timed out or cancelled); a late result is then ignored."""
        self._waiters.pop(correlation_id, None)
        if self._streams:
            self._streams.pop(correlation_id, None)

    def _end_stream(self, stream: ResponseStream) -> None:
        if self._streams.get(stream.correlation_id) is stream:
            del self._streams[stream.correlation_id]

    async def _touch(self) -> None:
        # The stream exists once a worker writes to it; keep an idle expiry on it.
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(self.stream, {b"hello": b"1"}, maxlen=self._maxlen, approximate=True)
        pipe.expire(self.stream, self._ttl_s)
        await pipe.execute()

    async def _read_loop(self) -> None:
        touched = asyncio.get_running_loop().time()
        while not self._closing:
            try:
                entries = await self._read()
                self.healthy = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down or restarting: keep trying, waiters wait
                self.healthy = False
                log.warning("reply stream read failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            self._check_limits()
            for entry_id, packed, count in entries:
                self._last_id = entry_id
                if packed is not None:
                    try:
                        self._dispatch(packed, count)
                    except Exception:  # one bad entry must not end the reader of them all
                        log.exception("reply entry %r on %s not dispatched", entry_id, self.stream)
                if self._over:
                    break  # read the rest again: the readers past their limit get a turn first
            now = asyncio.get_running_loop().time()
            if now - touched > self._ttl_s / 3:
                touched = now
                with contextlib.suppress(Exception):
                    await self._redis.expire(self.stream, self._ttl_s)

    async def _read(self) -> list[tuple[bytes, bytes | None, bytes | None]]:
        """The next entries of the stream (waiting up to ``block_ms``): their ids, their
        results field and their count field (None in an entry without one)."""
        if self._channel is None:
            reply: Any = await keyed_command(
                self._redis, self.stream,
                "XREAD", "COUNT", 256, "BLOCK", self._block_ms, "STREAMS", self.stream,
                self._last_id,
            )  # fmt: skip
            return [
                (entry_id, fields.get(STREAM_FIELD_RESULTS), fields.get(STREAM_FIELD_COUNT))
                for _, entries in reply or []
                for entry_id, fields in entries
            ]
        try:
            async with asyncio.timeout(self._block_ms / 1000 + READ_GRACE_S):
                raw: Any = await self._channel.call(
                    "XREAD", "COUNT", 256, "BLOCK", self._block_ms, "STREAMS", self.stream,
                    self._last_id,
                )  # fmt: skip
        except TimeoutError:
            await self._channel.close()  # a connection that stopped answering: make another
            raise
        # RESP2: [[stream, [[id, [field, value, ...]], ...]]], or nil when nothing came
        return [
            (entry_id, _field(flat, STREAM_FIELD_RESULTS), _field(flat, STREAM_FIELD_COUNT))
            for _, entries in raw or []
            for entry_id, flat in entries
        ]

    def _past_limit(self, stream: ResponseStream) -> None:
        self._over.append(stream)

    def _check_limits(self) -> None:
        """End the streams still past their limit now that their readers had a turn (the
        read that just returned waited for Redis; the event loop ran them meanwhile)."""
        over, self._over = self._over, []
        for stream in over:
            stream.check_limit()

    def _dispatch(self, packed: bytes, count: bytes | None = None) -> None:
        try:
            results = decode_results(packed, entry_count(count))
        except CodecError as exc:
            log.error("undecodable reply entry on %s: %s", self.stream, exc)
            return
        waiters, streams = self._waiters, self._streams
        for result in results:
            fut = waiters.pop(result.id, None)
            if fut is not None:
                if not result.final:  # a one-answer wait takes only a final result
                    waiters[result.id] = fut
                elif not fut.done():
                    fut.set_result(result)
            elif streams:
                stream = streams.get(result.id)
                if stream is not None:
                    stream.deliver(result)
