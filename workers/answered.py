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

A request skipped because its caller cancelled it is a failed request (Triton's reason
``CANCELED``); one skipped as a replay was counted by the run that answered it, and counts
nothing again. The two are told apart by the answer stored (``is_callers_cancel``): at
launch, the second call reads the start of each answer found (``CANCEL_PEEK_BYTES``, so a
replay's large answer does not travel); at intake, where the delivery count's script only
tells that an answer exists, the requests skipped are looked at the same way afterwards
(``cancelled``), one pipelined call per fetch that skipped any.

The writer's count of first writes does not tell which of a batch's answers were the first
(a replay's answer loses to the one stored, and so does one whose caller cancelled it just
before it ran; a write retried after its reply was lost finds its own answers stored).
Where fewer than all were, ``first_writes`` looks which answers the keys hold: only those
count as answered requests in the metrics.

A request skipped as answered that names a reply stream may be a producer's retry under
the same id (docs/protocol.md, "The request record"), whose caller waits on that stream: the
worker sends the stored answer there again (``stored_answers``, then
``ResultWriter.resend``) before the record is finished, and counts nothing for it. Only
where the request was sent after its answer was stored (its ``sent_us`` against the key's
remaining TTL, on Redis' clock, to the millisecond; either unknown: sent): a record
replayed after a crash or a rebalance was sent before the answer that its first run wrote
and added to its stream, so it adds no second copy. Never a caller's cancel (that caller
is gone). A decoupled model's request gets its stored responses before its final one (the
final's ``index`` tells how many; one expired since is left out). Each part is one
pipelined call of at most :data:`RESEND_CHUNK` keys; only fetches and batches that skipped
a request make any.

Redis not answering is not a reason to hold a batch back: the batch then runs whole, as it
would without this check.

On a Redis Cluster (``redis.cluster``) the batch's keys lie in many hash slots; redis-py's
cluster client splits that ``EXISTS`` by slot and sends the parts to their nodes at once,
so the code here is the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from plaza.codec import decode_result
from plaza.contract import InferResult
from plaza.errors import Cancelled, CodecError
from plaza.naming import Names
from plaza.retry import refused_for_good, until_done
from plaza.workers.runner import WorkItem
from plaza.workers.writer import ResultWriter, StoredAnswer

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 0.5
"""How long the look may take before the batch runs without it."""

RECHECK_AFTER_S = 0.05
"""An item looked for at intake is looked for again at launch once it has waited this long."""

CANCEL_PEEK_BYTES = 4096
"""How much of a stored answer is read to tell whether it is its caller's cancel: a small
error answer; one this long or longer is none."""

RESEND_CHUNK = 64
"""Stored answers read in one pipelined call to be sent again, at most."""

# KEYS: one result key. ARGV: when the request found answered was sent (Unix us, 0: not
# known), the answers' TTL (ms). Returns the answer unless the request was sent over a
# millisecond (the resolution of the key's TTL, and of Redis' clock in a script) before the
# answer was stored; nil when there is none (or not a string).
_SENT_AFTER_SCRIPT = """
local stored = redis.pcall('GET', KEYS[1])
if type(stored) ~= 'string' then
  return false
end
local sent, left = tonumber(ARGV[1]), redis.call('PTTL', KEYS[1])
if sent > 0 and left >= 0 then
  local now = redis.call('TIME')
  local stored_ms = now[1] * 1000 + math.floor(now[2] / 1000) - (tonumber(ARGV[2]) - left)
  if sent < (stored_ms - 1) * 1000 then
    return false
  end
end
return stored
"""
# KEYS: one answer key. ARGV: the SHA-1 of an answer's encoding. 1 when the key holds it.
_HOLDS_SCRIPT = """
local stored = redis.call('GET', KEYS[1])
if stored and redis.sha1hex(stored) == ARGV[1] then
  return 1
end
return 0
"""


class Look(NamedTuple):
    """A batch sorted by what its requests' result keys hold, each part in batch order."""

    run: list[WorkItem]
    """Not answered yet: to run."""
    answered: list[WorkItem]
    """Answered already (cancelled by their callers, or replays): finished unrun."""
    cancelled: list[WorkItem]
    """Those of ``answered`` whose answer is their caller's cancel."""


def _responses_before(final: bytes) -> int:
    """How many responses a decoupled model's request gave before its ``final`` one (each
    under its ``Names.response_key``): the final's ``index``."""
    try:
        return decode_result(final).index
    except CodecError:
        return 0


def is_callers_cancel(stored: bytes) -> bool:
    """Whether ``stored`` (an answer as stored, or its first ``CANCEL_PEEK_BYTES``) is the
    ``cancelled`` answer that a caller's producer stores (``ResultStore.cancel``); a
    model's own ``cancelled`` error answer names the worker that ran it."""
    if not stored or len(stored) >= CANCEL_PEEK_BYTES:
        return False
    try:
        result = decode_result(stored)
    except CodecError:  # not an answer Plaza wrote: a replay's, for all we know
        return False
    return result.error is not None and result.error.code == Cancelled.code and not result.worker


class AnsweredCheck:
    """Splits a batch into the items to run and the items already answered (those their
    callers cancelled apart), and tells which of a write's answers were the first."""

    def __init__(self, redis: aioredis.Redis, names: Names) -> None:
        self._redis = redis
        self._names = names

    async def split(
        self, batch: Sequence[WorkItem], now: float | None = None
    ) -> tuple[list[WorkItem], list[WorkItem]]:
        """(to run, already answered), each in the batch's order: ``look``'s first two."""
        look = await self.look(batch, now)
        return look.run, look.answered

    async def look(self, batch: Sequence[WorkItem], now: float | None = None) -> Look:
        """``batch`` sorted by its answers; no round trip when every item was looked for at
        intake less than :data:`RECHECK_AFTER_S` before ``now``."""
        since = (time.monotonic() if now is None else now) - RECHECK_AFTER_S
        if all(it.looked_at is not None and it.looked_at > since for it in batch):
            return Look(list(batch), [], [])
        keys = [self._names.result_key(it.request.id) for it in batch]
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                return await self._look(batch, keys)
        except Exception as exc:  # Redis away: run them; the write will retry until it is back
            log.debug("answered check skipped: %s", exc)
            return Look(list(batch), [], [])

    async def _look(self, batch: Sequence[WorkItem], keys: list[str]) -> Look:
        if not await self._redis.exists(*keys):
            return Look(list(batch), [], [])
        look = Look([], [], [])
        for item, stored in zip(batch, await self._peek(keys), strict=True):
            if not stored:
                look.run.append(item)
                continue
            look.answered.append(item)
            if is_callers_cancel(stored):
                look.cancelled.append(item)
        return look

    async def _peek(self, keys: Sequence[str]) -> list[bytes]:
        """The first ``CANCEL_PEEK_BYTES`` of each key's answer (empty: none): one
        pipelined call, one key per command."""
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.getrange(key, 0, CANCEL_PEEK_BYTES - 1)
        return [bytes(stored or b"") for stored in await pipe.execute()]

    async def cancelled(self, answered: Sequence[WorkItem]) -> list[WorkItem]:
        """Those of ``answered`` (items found answered) whose answer is their caller's
        cancel, in order; none where Redis does not tell."""
        keys = [self._names.result_key(it.request.id) for it in answered]
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                stored = await self._peek(keys)
        except Exception as exc:
            log.warning("%d skipped requests not counted (cancelled or not?): %s", len(keys), exc)
            return []
        return [it for it, s in zip(answered, stored, strict=True) if is_callers_cancel(s)]

    async def resend(
        self,
        writer: ResultWriter,
        items: list[WorkItem],
        ttl_s: int,
        decoupled: bool,
        who: str,
    ) -> None:
        """Send the stored answers of ``items`` (found answered) to their reply streams
        again, where a producer's retry under the same id waits (``stored_answers``: none
        for a replay or a caller's cancel), through ``writer``; retried while Redis is away,
        logged and given up on an error Redis will always give (``who`` names the sender)."""

        async def send() -> None:
            parts = self.stored_answers(items, ttl_s, decoupled)
            try:
                async with contextlib.aclosing(parts):
                    async for part in parts:
                        await writer.resend(part)
            except ResponseError as exc:
                if not refused_for_good(exc):
                    raise
                log.warning("%s: stored answers not sent again: %s", who, exc)

        await until_done(send, f"sending the stored answers of {len(items)} requests again")

    async def stored_answers(
        self, items: Sequence[WorkItem], ttl_s: int, decoupled: bool = False
    ) -> AsyncGenerator[list[StoredAnswer], None]:
        """What to send again to the reply streams of ``items`` (found answered), in parts
        to send in order: each stored answer whose request names a stream and was sent
        after it was stored (``ttl_s``: the answers' TTL), not a caller's cancel; a
        ``decoupled`` model's responses before its final one."""
        asked = [(it.request, s) for it in items if (s := it.request.reply.stream)]
        for start in range(0, len(asked), RESEND_CHUNK):
            part = asked[start : start + RESEND_CHUNK]
            ready: list[StoredAnswer] = []
            pipe = self._redis.pipeline(transaction=False)
            for req, _ in part:
                key = self._names.result_key(req.id)
                pipe.eval(_SENT_AFTER_SCRIPT, 1, key, req.sent_us, ttl_s * 1000)
            for (req, stream), final in zip(part, await pipe.execute(), strict=True):
                if not final or is_callers_cancel(final):
                    continue
                before = _responses_before(final) if decoupled else 0
                if before and ready:  # each request's responses go before its final one
                    yield ready
                    ready = []
                async for responses in self._responses(req.id, before, stream):
                    yield responses
                ready.append(StoredAnswer(req.id, bytes(final), stream))
            if ready:
                yield ready

    async def _responses(
        self, request_id: str, count: int, stream: str
    ) -> AsyncGenerator[list[StoredAnswer], None]:
        """Responses 0 to ``count`` - 1 of a decoupled model's request, those stored:
        :data:`RESEND_CHUNK` a pipelined call."""
        for first in range(0, count, RESEND_CHUNK):
            pipe = self._redis.pipeline(transaction=False)
            for index in range(first, min(count, first + RESEND_CHUNK)):
                pipe.get(self._names.response_key(request_id, index))
            found = await pipe.execute(raise_on_error=False)
            part = [
                StoredAnswer(request_id, bytes(p), stream) for p in found if isinstance(p, bytes)
            ]
            if part:
                yield part

    async def first_writes(
        self, answers: Sequence[InferResult], payloads: Sequence[bytes]
    ) -> list[bool]:
        """For each of ``answers`` just written as ``payloads`` (the bytes the writer stored
        for each: ``ResultWriter.stored_payloads``), whether its key holds them: it was the
        first answer (the writer's count does not tell which). One pipelined call, each
        compared in Redis by its digest, so none travels back; all False where Redis does
        not tell (better a request not counted than one counted twice)."""
        pipe = self._redis.pipeline(transaction=False)
        for result, payload in zip(answers, payloads, strict=True):
            key = self._names.answer_key(result.id, result.index, result.final)
            digest = hashlib.sha1(payload, usedforsecurity=False).hexdigest()
            pipe.eval(_HOLDS_SCRIPT, 1, key, digest)
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                held = await pipe.execute()
        except Exception as exc:
            log.warning("%d answers not counted (first written or not?): %s", len(answers), exc)
            return [False] * len(answers)
        return [bool(int(h)) for h in held]
