"""Skipping requests that already have an answer, before they run.

A request's result key is written once (first write wins, ``workers/writer.py``). It can
exist before a worker runs the request in two cases: its caller cancelled it (the producer
core stores a ``cancelled`` answer, ``plaza.results.ResultStore.cancel``), or it is a
replay of a request answered before a crash or a rebalance. Running it again would only
lose the write, so the worker looks first and skips it: no execution, no second answer,
its offset committed like any other.

The look costs one ``EXISTS`` over the batch's keys (one round trip per batch); only when
some exist does a second, pipelined call tell which. Redis not answering is not a reason
to hold a batch back: the batch then runs whole, as it would without this check.

On a Redis Cluster (``redis.cluster``) the batch's keys lie in many hash slots; redis-py's
cluster client splits that ``EXISTS`` by slot and sends the parts to their nodes at once,
so the code here is the same for both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import redis.asyncio as aioredis

from plaza.naming import Names
from plaza.workers.runner import WorkItem

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 0.5
"""How long the look may take before the batch runs without it."""


class AnsweredCheck:
    """Splits a batch into the items to run and the items already answered."""

    def __init__(self, redis: aioredis.Redis, names: Names) -> None:
        self._redis = redis
        self._names = names

    async def split(self, batch: Sequence[WorkItem]) -> tuple[list[WorkItem], list[WorkItem]]:
        """(to run, already answered), each in the batch's order."""
        keys = [self._names.result_key(it.request.id) for it in batch]
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                return await self._split(batch, keys)
        except Exception as exc:  # Redis away: run them; the write will retry until it is back
            log.debug("answered check skipped: %s", exc)
            return list(batch), []

    async def _split(
        self, batch: Sequence[WorkItem], keys: list[str]
    ) -> tuple[list[WorkItem], list[WorkItem]]:
        if not await self._redis.exists(*keys):
            return list(batch), []
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        found = await pipe.execute()
        run = [it for it, hit in zip(batch, found, strict=True) if not hit]
        answered = [it for it, hit in zip(batch, found, strict=True) if hit]
        return run, answered
