"""Traffic for fault tests: a paced load of identity requests, and a result-stream tail."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import redis.asyncio
from redis.exceptions import RedisError

from plaza.client import PlazaClient, make_request
from plaza.codec import decode_results
from plaza.contract import InferRequest
from plaza.naming import STREAM_FIELD_RESULTS
from plaza.stack.waiting import POLL_S
from tests.faults.harness import MODEL, value


class Load:
    """``n`` identity requests published in chunks at ``rate`` per second, answers to ``stream``.

    A chunk that Kafka does not acknowledge (broker down, leader moving) is published again
    with the same requests and ids, as a client would retry; the idempotent result writer
    makes the resend harmless.
    """

    def __init__(
        self,
        client: PlazaClient,
        stream: str | None,
        n: int,
        *,
        rate: float,
        chunk: int = 50,
        give_up_s: float = 60.0,
    ) -> None:
        self.client = client
        self.stream = stream
        self.n = n
        self.rate = rate
        self.chunk = chunk
        self.give_up_s = give_up_s
        self.expected: dict[str, np.ndarray[Any, Any]] = {}
        """Correlation id -> the answer it must get."""
        self.sent_at: dict[str, float] = {}
        """Correlation id -> when it was first handed to the producer (monotonic)."""
        self.acked_at: dict[str, float] = {}
        """Correlation id -> when Kafka acknowledged it (monotonic)."""
        self.resent = 0
        self.errors: Counter[str] = Counter()

    def request(self, i: int) -> InferRequest:
        return make_request(
            MODEL, {"INPUT0": value(i)}, reply_stream=self.stream, correlation_id=f"req-{i:06d}"
        )

    @property
    def acked(self) -> int:
        return len(self.acked_at)

    async def run(self) -> None:
        start = time.monotonic()
        for first in range(0, self.n, self.chunk):
            due = start + first / self.rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # pacing, not syncing
            await self._publish(
                [self.request(i) for i in range(first, min(first + self.chunk, self.n))]
            )

    async def _publish(self, requests: list[InferRequest]) -> None:
        now = time.monotonic()
        for req in requests:
            self.expected[req.id] = req.inputs[0].to_numpy()
            self.sent_at[req.id] = now
        give_up = time.monotonic() + self.give_up_s
        while True:
            try:
                await self.client.publish_many(requests)
                break
            except Exception as exc:  # not acknowledged: resend the whole chunk
                self.errors[type(exc).__name__] += 1
                if time.monotonic() > give_up:
                    raise
                self.resent += len(requests)
                await asyncio.sleep(0.2)
        now = time.monotonic()
        for req in requests:
            self.acked_at.setdefault(req.id, now)

    def sent_before(self, t: float) -> set[str]:
        return {rid for rid, at in self.sent_at.items() if at <= t}


class ResultTail:
    """Follows a result stream from its start; notes each answer's first arrival time.

    Survives Redis restarts (reconnects and resumes after the last entry it read).
    """

    def __init__(self, redis_url: str, stream: str) -> None:
        self.stream = stream
        self._redis = redis.asyncio.Redis.from_url(
            redis_url, socket_timeout=5, socket_connect_timeout=1
        )
        self.first_seen: dict[str, float] = {}
        self.by_worker: Counter[str] = Counter()
        self.entries = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    @property
    def answered(self) -> int:
        return len(self.first_seen)

    def start(self) -> ResultTail:
        self._task = asyncio.create_task(self._follow(), name=f"tail:{self.stream}")
        return self

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)
        await self._redis.aclose()

    async def _follow(self) -> None:
        last: bytes | str = "0-0"
        while not self._stopping:
            try:
                reply: Any = await self._redis.xread({self.stream: last}, count=500, block=200)
            except (RedisError, OSError):  # Redis down or loading its AOF: try again
                await asyncio.sleep(POLL_S)
                continue
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    last = entry_id
                    self._note(fields)

    def _note(self, fields: Mapping[bytes, bytes]) -> None:
        now = time.monotonic()
        self.entries += 1
        for res in decode_results(fields[STREAM_FIELD_RESULTS]):
            self.first_seen.setdefault(res.id, now)
            self.by_worker[res.worker] += 1

    def open_at(self, load: Load, fault_at: float) -> int:
        """Requests in flight at the fault: sent before it, answered only after it."""
        return sum(
            1
            for rid in load.sent_before(fault_at)
            if self.first_seen.get(rid, float("inf")) > fault_at
        )

    def worst_wait_s(self, load: Load) -> float:
        """The longest any request waited, first send to first answer: what the fault cost
        the unluckiest client (publish retries, replay after a rebalance, write retries)."""
        waits = [
            self.first_seen[rid] - at for rid, at in load.sent_at.items() if rid in self.first_seen
        ]
        return max(waits, default=float("nan"))
