"""Delivery counts: how often each Kafka record reached a worker, and how often it ran alone.

A record that crashes its worker (a backend that aborts on some input, an OOM kill) is never
committed, so the next owner of its partition gets it again, and dies too. Counting in
Redis, across workers and restarts, breaks that loop:

- ``deliveries``: incremented for every record of a fetch, in one script call per fetch. A
  record delivered before (count >= 2) was in flight when a worker stopped: a suspect.
- ``trials``: incremented when a suspect is about to run alone (after everything before it
  is durable), so a crash during that run is charged to that record only. The records that
  merely waited behind a crashing one are never charged. A suspect whose trials reach
  ``max_deliveries`` has been delivered that many times without an answer: it is poison.

Each record's counts live in one small hash under the deployment's key prefix, with a TTL;
the counters of answered records are deleted in the next script call, so the keys held are
those of records in flight, not of every record ever served.

On a Redis Cluster the records of a fetch have keys in many hash slots, where one script
call may not reach: there the same commands go in one non-transactional pipeline, one key
per command (still one round trip; counting loses only its atomicity, which it never
needed, since each record's counter belongs to one partition's owner at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis.asyncio as aioredis

from plaza.connections import is_cluster
from plaza.naming import Names

log = logging.getLogger(__name__)

RecordId = tuple[str, int, int]
"""(topic, partition, offset) of one record."""

# KEYS: n counters to count a delivery on, then counters to delete. ARGV: ttl, n.
_COUNT_SCRIPT = """
local ttl, n = ARGV[1], tonumber(ARGV[2])
local counts = {}
for i = 1, n do
  counts[i] = redis.call('HINCRBY', KEYS[i], 'deliveries', 1)
  redis.call('EXPIRE', KEYS[i], ttl)
end
for i = n + 1, #KEYS do
  redis.call('DEL', KEYS[i])
end
return counts
"""
_TRIAL = "trials"
_DELIVERIES = "deliveries"


class DeliveryCounter:
    """Counts deliveries per record in Redis, under the deployment's key prefix."""

    def __init__(self, redis: aioredis.Redis, names: Names, ttl_s: int) -> None:
        self._redis = redis
        self._names = names
        self._ttl_s = ttl_s
        self._script = redis.register_script(_COUNT_SCRIPT)
        self._cluster = is_cluster(redis)
        self._finished: list[str] = []

    def _key(self, record: RecordId) -> str:
        return self._names.delivery_key(*record)

    async def count(self, records: Sequence[RecordId]) -> list[int]:
        """This delivery's number for each record (1 the first time), in order.

        When Redis cannot be reached every record counts as a first delivery: poison
        detection pauses, serving does not (the writer waits for Redis anyway).
        """
        if not records:
            return []
        finished, self._finished = self._finished, []
        keys = [self._key(r) for r in records]
        try:
            counts = await self._count(keys, finished)
        except Exception as exc:  # Redis away: the writer's retries will notice too
            log.warning("counting %d deliveries failed: %s", len(keys), exc)
            self._finished = finished + self._finished
            return [1] * len(records)
        return counts

    async def _count(self, keys: list[str], finished: list[str]) -> list[int]:
        """Count a delivery on each of ``keys``, delete ``finished``: one round trip."""
        if not self._cluster:
            counts = await self._script(keys=[*keys, *finished], args=[self._ttl_s, len(keys)])
            return [int(c) for c in counts]
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hincrby(key, _DELIVERIES, 1)
            pipe.expire(key, self._ttl_s)
        for key in finished:
            pipe.delete(key)
        replies = await pipe.execute()
        return [int(c) for c in replies[: 2 * len(keys) : 2]]

    async def trial(self, record: RecordId) -> int:
        """Count one run alone of a suspect; its number (1 the first time).

        0 when Redis cannot be reached: the suspect runs, unjudged."""
        key = self._key(record)
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.hincrby(key, _TRIAL, 1)
            pipe.expire(key, self._ttl_s)
            trials, _ = await pipe.execute()
        except Exception as exc:
            log.warning("counting a trial of %s failed: %s", key, exc)
            return 0
        return int(trials)

    def finished(self, records: Sequence[RecordId]) -> None:
        """These records were answered (or handed back): drop their counters next call."""
        self._finished.extend(self._key(r) for r in records)

    async def flush(self) -> None:
        """Delete the counters of finished records now (before a partition moves on)."""
        finished, self._finished = self._finished, []
        if not finished:
            return
        try:
            await self._count([], finished)
        except Exception as exc:
            log.warning("dropping %d delivery counters failed: %s", len(finished), exc)
