"""Delivery counts: how often each Kafka record reached a worker, and how often it ran alone.

A record that crashes its worker (a backend that aborts on some input, an OOM kill) is never
committed, so the next owner of its partition gets it again, and dies too. Counting in
Redis, across workers and restarts, breaks that loop:

- ``deliveries``: incremented for every record of a fetch, in one script call per fetch.
- ``running``: set when a batch holding the record starts to run (``running``: one command
  per batch, written to the socket before the model runs, its reply not waited for). A
  record delivered before (count >= 2) that a worker began to run was in a batch when that
  worker stopped: a suspect. One merely fetched (it waited in a batcher that died) is not:
  it did not crash anyone, and is batched as a first delivery.
- ``trials``: incremented when a suspect is about to run alone (after everything before it
  is durable), so a crash during that run is charged to that record only. The records that
  merely waited behind a crashing one are never charged. A suspect whose trials reach
  ``max_deliveries`` has been delivered that many times without an answer: it is poison.

Each record's counts live in one small hash under the deployment's key prefix, with a TTL;
the counters of answered records are deleted in the next script call, so the keys held are
those of records in flight, not of every record ever served.

The same call also looks whether each record's request already has an answer (its result
key exists: a caller cancelled it, or it is a replay; ``workers/answered.py``), since the
worker needs both before it admits the fetch: one round trip per fetch for both, on the
counter's own connection (``plaza.resp_channel``).

On a Redis Cluster the records of a fetch have keys in many hash slots, where one script
call may not reach: there the same commands go in one non-transactional pipeline, one key
per command (still one round trip; counting loses only its atomicity, which it never
needed, since each record's counter belongs to one partition's owner at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import redis.asyncio as aioredis

from plaza.connections import is_cluster
from plaza.naming import Names
from plaza.resp_channel import ChannelScript

log = logging.getLogger(__name__)

RecordId = tuple[str, int, int]
"""(topic, partition, offset) of one record."""

# KEYS: n counters to count a delivery on, m result keys to look for, then counters to
# delete. ARGV: ttl, n, m. Returns the n counts, then 1 or 0 for each counter's running
# mark, then 1 or 0 for each result key.
_COUNT_SCRIPT = """
local ttl, n, m = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 1, n do
  out[i] = redis.call('HINCRBY', KEYS[i], 'deliveries', 1)
  out[n + i] = redis.call('HEXISTS', KEYS[i], 'running')
  redis.call('EXPIRE', KEYS[i], ttl)
end
for i = n + 1, n + m do
  out[n + i] = redis.call('EXISTS', KEYS[i])
end
for i = n + m + 1, #KEYS do
  redis.call('DEL', KEYS[i])
end
return out
"""
# KEYS: the counters of a batch's records. ARGV: ttl. Marks them running.
_RUNNING_SCRIPT = """
for i = 1, #KEYS do
  redis.call('HSET', KEYS[i], 'running', 1)
  redis.call('EXPIRE', KEYS[i], ARGV[1])
end
return #KEYS
"""
_TRIAL = "trials"
_DELIVERIES = "deliveries"
_RUNNING = "running"


class Counted(NamedTuple):
    """What one fetch's count found."""

    counts: list[int]
    """This delivery's number for each record (1 the first time)."""
    ran: list[bool]
    """Whether an earlier delivery of each record began to run it (in a batch, or alone)."""
    answered: list[bool | None]
    """Whether each record's result key exists (None: not looked for, or Redis away)."""

    def suspects(self) -> list[int]:
        """Each record's delivery number as a suspect: its count where an earlier delivery
        ran it, else 1 (a first delivery, or one only fetched by a worker that stopped)."""
        return [c if ran else 1 for c, ran in zip(self.counts, self.ran, strict=True)]


class DeliveryCounter:
    """Counts deliveries per record in Redis, under the deployment's key prefix."""

    def __init__(self, redis: aioredis.Redis, names: Names, ttl_s: int) -> None:
        self._redis = redis
        self._names = names
        self._ttl_s = ttl_s
        self._script = ChannelScript(redis, _COUNT_SCRIPT)
        self._running = ChannelScript(redis, _RUNNING_SCRIPT, share=self._script)
        self._cluster = is_cluster(redis)
        self._finished: list[str] = []

    async def close(self) -> None:
        """Close the counter's own Redis connection (the client stays the caller's)."""
        await self._script.close()

    def _key(self, record: RecordId) -> str:
        return self._names.delivery_key(*record)

    async def count(self, records: Sequence[RecordId]) -> list[int]:
        """This delivery's number for each record (1 the first time), in order.

        When Redis cannot be reached every record counts as a first delivery: poison
        detection pauses, serving does not (the writer waits for Redis anyway).
        """
        counts, _ = await self.count_and_look(records, [None] * len(records))
        return counts

    async def count_and_look(
        self, records: Sequence[RecordId], result_keys: Sequence[str | None]
    ) -> tuple[list[int], list[bool | None]]:
        """``count``, and for each record whether ``result_keys``' key exists (None where
        no key was given, or where Redis could not be reached): one round trip."""
        counted = await self.take(records, result_keys)
        return counted.counts, counted.answered

    async def take(self, records: Sequence[RecordId], result_keys: Sequence[str | None]) -> Counted:
        """Count a fetch's records, read whether an earlier delivery ran each, and look
        whether each of ``result_keys`` exists: one round trip."""
        if not records:
            return Counted([], [], [])
        finished, self._finished = self._finished, []
        keys = [self._key(r) for r in records]
        looked = [i for i, k in enumerate(result_keys) if k is not None]
        look = [k for k in result_keys if k is not None]
        try:
            counts, ran, found = await self._count(keys, finished, look)
        except Exception as exc:  # Redis away: the writer's retries will notice too
            log.warning("counting %d deliveries failed: %s", len(keys), exc)
            self._finished = finished + self._finished
            n = len(records)
            return Counted([1] * n, [False] * n, [None] * n)
        answered: list[bool | None] = [None] * len(records)
        for i, hit in zip(looked, found, strict=True):
            answered[i] = hit
        return Counted(counts, ran, answered)

    async def _count(
        self, keys: list[str], finished: list[str], look: Sequence[str] = ()
    ) -> tuple[list[int], list[bool], list[bool]]:
        """Count a delivery on each of ``keys`` (and read its running mark), look for each
        of ``look``, delete ``finished``: one round trip."""
        n = len(keys)
        if not self._cluster:
            out = await self._script([*keys, *look, *finished], [self._ttl_s, n, len(look)])
            ran = [bool(r) for r in out[n : 2 * n]]
            return [int(c) for c in out[:n]], ran, [bool(e) for e in out[2 * n :]]
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hincrby(key, _DELIVERIES, 1)
            pipe.hexists(key, _RUNNING)
            pipe.expire(key, self._ttl_s)
        for key in look:
            pipe.exists(key)
        for key in finished:
            pipe.delete(key)
        replies = await pipe.execute()
        found = replies[3 * n : 3 * n + len(look)]
        counts, ran = replies[: 3 * n : 3], replies[1 : 3 * n : 3]
        return [int(c) for c in counts], [bool(r) for r in ran], [bool(e) for e in found]

    async def running(self, records: Sequence[RecordId]) -> None:
        """Mark these records running: a batch holding them starts now. On a single Redis
        the command is written to the counter's connection at once and its reply is not
        waited for, so it is on its way before the model runs (and lands if the process
        dies during the run) at no round trip's cost; a failure is only logged (a crash
        then replays the batch as first deliveries, which mark it again). On a Redis
        Cluster (no such connection) it is one pipeline, one key per command, waited for."""
        if not records:
            return
        keys = [self._key(r) for r in records]
        try:
            if not self._cluster:
                await self._running.send(keys, [self._ttl_s])
                return
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.hset(key, _RUNNING, 1)
                pipe.expire(key, self._ttl_s)
            await pipe.execute()
        except Exception as exc:
            log.warning("marking %d records running failed: %s", len(keys), exc)

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
