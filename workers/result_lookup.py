"""Looking up many result keys at once: one ``MGET`` per round, whoever asks (on a Redis
Cluster, where the keys lie in different hash slots, one pipeline of GETs instead).

The ensemble runner asks for stored answers all the time (is this request answered
already? is this step's answer stored? has the step I wait for been answered on its key
only?), from as many tasks as it has requests in flight. Each asking task would hold a Redis
connection of its own; instead every ``get`` joins the next round, and a single task reads
the round's keys with one ``MGET`` (at most ``MAX_KEYS`` a call), so the runner uses one
connection for lookups however many requests it holds.

A lookup is a hint, never a reason to stop: when Redis does not answer, ``get`` says
"not stored" and the caller goes on as if it had not looked (it publishes, it runs).
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from plaza.codec import decode_result
from plaza.connections import is_cluster
from plaza.contract import InferResult
from plaza.errors import CodecError
from plaza.naming import Names
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

MAX_KEYS = 512
"""Keys read by one MGET."""
LOOKUP_TIMEOUT_S = 2.0
"""A round that takes longer answers "not stored" to everyone in it."""


class ResultLookup:
    """Batched reads of result keys (``Names.result_key``) for many waiting tasks."""

    def __init__(self, redis: aioredis.Redis, names: Names) -> None:
        self._redis = redis
        self._names = names
        self._waiting: dict[str, list[asyncio.Future[InferResult | None]]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="result-lookup")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        for futures in self._waiting.values():
            for fut in futures:
                fut.cancel()
        self._waiting.clear()

    async def get(self, correlation_id: str) -> InferResult | None:
        """The answer stored under ``correlation_id``; None when there is none (or Redis
        did not answer)."""
        fut: asyncio.Future[InferResult | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(correlation_id, []).append(fut)
        self._wake.set()
        return await fut

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                ids = list(self._waiting)[:MAX_KEYS]
                asked = [self._waiting.pop(rid) for rid in ids]
                found = await self._read(ids)
                for futures, result in zip(asked, found, strict=True):
                    for fut in futures:
                        if not fut.done():
                            fut.set_result(result)

    async def _read(self, ids: list[str]) -> list[InferResult | None]:
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                raws = await self._get_all(ids)
        except Exception as exc:  # Redis away: nothing is known to be stored
            log.warning("result lookup of %d keys failed: %s", len(ids), exc)
            return [None] * len(ids)
        return [_decode(raw) for raw in raws]

    async def _get_all(self, ids: list[str]) -> list[bytes | str | None]:
        keys = [self._names.result_key(rid) for rid in ids]
        if not is_cluster(self._redis):
            return list(await self._redis.mget(keys))
        pipe = self._redis.pipeline(transaction=False)  # split by node; MGET would be CROSSSLOT
        for key in keys:
            pipe.get(key)
        return list(await pipe.execute())


def _decode(raw: bytes | str | None) -> InferResult | None:
    if raw is None:
        return None
    try:
        return decode_result(raw.encode() if isinstance(raw, str) else raw)
    except CodecError as exc:  # not an answer Plaza wrote: as good as none
        log.warning("undecodable result key: %s", exc)
        return None
