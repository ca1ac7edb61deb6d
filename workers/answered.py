"""Skipping requests that already have an answer, before they run.

A request's result key is written once (first write wins, ``workers/writer.py``). It can
exist before a worker runs the request in two cases: its caller cancelled it (the producer
core stores a ``cancelled`` answer, ``plaza.results.ResultStore.cancel``), or it is a
replay of a request answered before a crash or a rebalance. Running it again would only
lose the write, so the worker looks first and skips it: no execution, no second answer,
its offset committed like any other.

The worker looks twice. At intake, the delivery count's script also tells whether each
fetched record's result key exists (``workers/deliveries.py``; the record's Kafka key is
its request id), so answered records are finished there and never queue. At launch, a
batch is looked at again (one ``EXISTS`` over its keys; only when some exist does a second,
pipelined call tell which) only if some of its items were not looked for at intake (a
record whose key is not its id, a Redis error) or have waited longer than
:data:`RECHECK_AFTER_S` since: so a batch that forms quickly costs no round trip of its
own, and a request cancelled while it waits longer than that is still skipped. One
cancelled less than that before its batch runs is run; its answer loses to the cancelled
one (first write wins), so its caller sees the same answer either way.

Redis not answering is not a reason to hold a batch back: the batch then runs whole, as it
would without this check.

On a Redis Cluster (``redis.cluster``) the batch's keys lie in many hash slots; redis-py's
cluster client splits that ``EXISTS`` by slot and sends the parts to their nodes at once,
so the code here is the same for both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from plaza.naming import Names
from plaza.workers.runner import WorkItem

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 0.5
"""How long the look may take before the batch runs without it."""

RECHECK_AFTER_S = 0.05
"""An item looked for at intake is looked for again at launch once it has waited this long."""


class AnsweredCheck:
    """Splits a batch into the items to run and the items already answered."""

    def __init__(self, redis: aioredis.Redis, names: Names) -> None:
        self._redis = redis
        self._names = names

    async def split(
        self, batch: Sequence[WorkItem], now: float | None = None
    ) -> tuple[list[WorkItem], list[WorkItem]]:
        """(to run, already answered), each in the batch's order; no round trip when every
        item was looked for at intake less than :data:`RECHECK_AFTER_S` before ``now``."""
        since = (time.monotonic() if now is None else now) - RECHECK_AFTER_S
        if all(it.looked_at is not None and it.looked_at > since for it in batch):
            return list(batch), []
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
