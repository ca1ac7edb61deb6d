"""The reply multiplexer: one Redis reader per process, results routed by correlation id.

A gateway (or an SDK client) owns one reply stream. Waiting requests register a future
under their correlation id before they publish; a single ``XREAD BLOCK`` loop reads the
stream and resolves the futures. No connection or task per waiting request: the loop
reads on a connection of its own (``plaza.resp_channel``; redis-py's client on a Redis
Cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis

from plaza.codec import decode_results
from plaza.contract import InferResult
from plaza.errors import CodecError
from plaza.naming import STREAM_FIELD_RESULTS
from plaza.resp_channel import channel_for
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READ_GRACE_S = 10.0
"""How long past its ``BLOCK`` a read may take before the connection counts as dead."""


def _field(flat: list[bytes], name: bytes) -> bytes | None:
    """A stream entry's field ``name`` from its flat [field, value, ...] list."""
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == name:
            return flat[i + 1]
    return None


class ReplyMux:
    """Reads ``stream`` and completes ``wait`` futures by correlation id."""

    def __init__(self, redis: aioredis.Redis, stream: str, *, ttl_s: int, maxlen: int) -> None:
        self.stream = stream
        self._redis = redis
        self._channel = channel_for(redis)
        self._ttl_s = ttl_s
        self._maxlen = maxlen
        self._waiters: dict[str, asyncio.Future[InferResult]] = {}
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
        for fut in self._waiters.values():
            fut.cancel()
        self._waiters.clear()
        with contextlib.suppress(Exception):
            await self._redis.delete(self.stream)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def expect(self, correlation_id: str) -> asyncio.Future[InferResult]:
        """Register interest before publishing; await the future for the result."""
        fut: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        self._waiters[correlation_id] = fut
        return fut

    def forget(self, correlation_id: str) -> None:
        """Drop a waiter (timed out or cancelled); a late result is then ignored."""
        self._waiters.pop(correlation_id, None)

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
            for entry_id, packed in entries:
                self._last_id = entry_id
                if packed is not None:
                    self._dispatch(packed)
            now = asyncio.get_running_loop().time()
            if now - touched > self._ttl_s / 3:
                touched = now
                with contextlib.suppress(Exception):
                    await self._redis.expire(self.stream, self._ttl_s)

    async def _read(self) -> list[tuple[bytes, bytes | None]]:
        """The next entries of the stream (waiting up to ``block_ms``): their ids and their
        results field (None in an entry without one)."""
        if self._channel is None:
            reply: Any = await self._redis.xread(
                {self.stream: self._last_id}, count=256, block=self._block_ms
            )
            return [
                (entry_id, fields.get(STREAM_FIELD_RESULTS))
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
            (entry_id, _field(flat, STREAM_FIELD_RESULTS))
            for _, entries in raw or []
            for entry_id, flat in entries
        ]

    def _dispatch(self, packed: bytes) -> None:
        try:
            results = decode_results(packed)
        except CodecError as exc:
            log.error("undecodable reply entry on %s: %s", self.stream, exc)
            return
        for result in results:
            fut = self._waiters.pop(result.id, None)
            if fut is not None and not fut.done():
                fut.set_result(result)
