"""Writing a batch's results to Redis: one round trip, idempotent per correlation id.

One Lua script call per batch, on the writer's own connection (``plaza.resp_channel``). For
each result it does ``SET result-key payload NX EX ttl``; only when that SET wins (the
first answer for this correlation id) is the result also added to its reply stream. A
replayed request (after a crash or a rebalance) therefore never shows a second, different
answer: first write wins. The results that a batch sends to one stream travel as one stream
entry (``n`` = count, ``r`` = the result batch of ``plaza.codec``), save that an entry holds
at most ``MAX_ENTRY_RESPONSES`` results of one request (a decoupled model's responses, the
next ones go into the stream's next entry): the reply reader hands an entry over whole,
and a request's responses must reach its caller in parts smaller than the responses it may
hold for them (``plaza.replies``).

Each result is encoded once, here in Python, with the codec; the script only stores those
bytes and joins the winners of a stream (``plaza.codec.join_results`` is the same join), so
the results wire format has one definition. Each XADD runs under ``pcall``: a reply stream
that cannot take an entry (a key of another type at that name) loses only its own results,
never a batch-mate's. Every XADD also (re)sets the stream's idle expiry, so a stream whose
reader went away, and that late results recreate, still expires.

A result whose encoding is over ``redis.max_result_bytes``, or over Redis' own
``proto-max-bulk-len`` where that is smaller, is answered with a ``payload_too_large`` error
in its place: Redis answers a larger value with a protocol error and closes the connection,
which the writer may see as a lost connection only, so the limit is read from Redis before
the first write and again after a failed one. A write that Redis refuses with an error
reply that the same write would get again (``plaza.retry.refused_for_good``) is not retried
as it is: ``write_until_done`` writes each half of it on its own, down to the result Redis
refuses, which is answered with an ``internal`` error in its place (with its sequence's
state, else without); its batch-mates keep their answers.

A decoupled model's responses that are not final go under their own keys
(``Names.response_key``), first write wins per response: a replay adds to the stream only
the responses that its first run did not write.

Answers stored already can be added to reply streams again (``resend``: no key written,
the bytes as stored, the same entries, bound and expiry): a worker sends a request's stored
answer to the stream of a producer's retry under the same id, which it does not run
(``workers/answered.py``).

A stateful model's answers carry their sequence's state (``StateWrite``): the state after
the request, kept under the sequence's key, or the key dropped after its END. The script
writes a state only where its answer's SET won, in the same call: the state Redis holds is
always the one after the sequence's last answered request, so the next owner of the
sequence's partition (after a rebalance or a crash) goes on from it, and a replay, which
writes no answer, writes no state either (``workers/sequences.py``).

On a Redis Cluster (``redis.cluster``) one script cannot span the result keys of many
requests and their reply streams: they live in different hash slots. There the batch is
written in two pipelined steps, each command touching one key: a claim script per result
key (``SET NX EX``; a key that already holds this very payload, stored by an earlier try of
this same write, counts as claimed too), then, for each stream, one single-key script that
adds the claimed results (XADD under ``pcall``, then EXPIRE). Redis Cluster's client sends
each step to all nodes at once, so a batch costs two round trips instead of one. First
write wins as before: a replay encodes a different payload (its own timings) and claims
nothing. What the cluster loses is the atomicity of the two steps: a worker that dies
between them leaves results stored (pollable) but not on their reply stream; and a write
retried after a step failed midway (a node away) adds its results to the streams again,
so a stream may then hold the same answer twice (byte for byte the same). States go with
the second step, for the claimed answers, under the sequences' keys; a stateful answer's
claim also stores its state under ``Names.answer_state_key`` (same slot as the answer, in
the claim's script: an END's as an empty value). A worker that dies between the steps
leaves a sequence's key one request behind its answers; the sequence's next owner finds
that request answered at intake and takes the sequence up from the state stored with that
answer (``workers/sequences.py``), not from the sequence's key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from plaza.codec import encode_result, join_results
from plaza.connections import is_cluster
from plaza.contract import NO_PARAMETERS, ErrorInfo, InferResult
from plaza.errors import PayloadTooLarge, PlazaError
from plaza.naming import Names
from plaza.resp_channel import ChannelScript
from plaza.retry import refused_for_good, until_done
from plaza.settings import RedisSettings

log = logging.getLogger(__name__)

# KEYS: n result keys, the streams of the entries (one per entry, in order: a stream may
# take several), then m state keys.
# ARGV: result ttl, maxlen, stream ttl, n, then per result: payload, entry index (0 = none;
# 1-based into the entries); then (only where there are states) m, and per state: the
# 1-based index of its result, the state ('' drops the key), its ttl in ms.
# Returns {first writes, results lost to failed XADDs, error}.
_WRITE_SCRIPT = """
local ttl, maxlen, stream_ttl, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local per_stream, won = {}, {}
local written = 0
for i = 1, n do
  local payload, s = ARGV[3 + 2 * i], tonumber(ARGV[4 + 2 * i])
  if redis.call('SET', KEYS[i], payload, 'NX', 'EX', ttl) then
    written = written + 1
    won[i] = true
    if s > 0 then
      per_stream[s] = per_stream[s] or {}
      table.insert(per_stream[s], payload)
    end
  end
end
local m = tonumber(ARGV[5 + 2 * n] or '0')
for j = 1, m do
  local at = 5 + 2 * n + 3 * (j - 1)
  if won[tonumber(ARGV[at + 1])] then
    local key, state = KEYS[#KEYS - m + j], ARGV[at + 2]
    if state == '' then
      redis.call('DEL', key)
    else
      redis.call('SET', key, state, 'PX', ARGV[at + 3])
    end
  end
end
local lost, last_error = 0, ''
for s = 1, #KEYS - n - m do  -- in order: a stream's entries keep its results' order
  local payloads = per_stream[s]
  if payloads then
    local stream = KEYS[n + s]
    local added = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*',
                              'n', #payloads, 'r', table.concat(payloads))
    if type(added) == 'table' and added.err then
      lost, last_error = lost + #payloads, stream .. ': ' .. added.err
    else
      redis.call('EXPIRE', stream, stream_ttl)
    end
  end
end
return {written, lost, last_error}
"""
# Cluster mode, step 1: KEYS: one result key. ARGV: payload, ttl. Returns 1 when the key
# holds this payload now (stored by this call, or by an earlier try of the same write).
_CLAIM_SCRIPT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return 1
end
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 0
"""
# Cluster mode, step 1 for a stateful model's answer: KEYS: its result key, its answer
# state key (one slot). ARGV: payload, ttl, state ("" after an END), state ttl ms. As the
# claim above; a claimed answer also stores its state.
_CLAIM_WITH_STATE_SCRIPT = """
local claimed = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if not claimed and redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return 1
"""
# Cluster mode, step 2: KEYS: one stream. ARGV: maxlen, stream ttl, count, joined results.
# Returns '' or the XADD error.
_STREAM_SCRIPT = """
local added = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*',
                          'n', ARGV[3], 'r', ARGV[4])
if type(added) == 'table' and added.err then
  return added.err
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return ''
"""
_BULK_LIMIT = "proto-max-bulk-len"
_MAX_PER_CALL = 8192  # results per script call: Redis serves nothing else while one runs
MAX_ENTRY_RESPONSES = 256
"""Results of one request in one reply stream entry, at most: well below the responses a
reply reader holds for a caller (``plaza.replies.MAX_PENDING_RESPONSES``)."""
Results = Sequence[tuple[InferResult, str | None]]
"""(result, reply stream) pairs; None: the result key alone."""


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """An answer as its key holds it, to add to a reply stream again (``resend``)."""

    request_id: str
    payload: bytes
    stream: str


@dataclass(frozen=True, slots=True)
class StateWrite:
    """A sequence's state to keep under ``key`` (``state``; None drops the key), written
    with the answer at ``index`` of the same write, and only where that answer is the
    first written for its request."""

    index: int
    key: str
    state: bytes | None
    ttl_ms: int


class _Entries:
    """Which reply stream entry each result goes into: a stream's results share its latest
    entry, until one request has ``per_request`` results there; its next one opens the
    stream's next entry (so a batch of ordinary results, one per request, stays one entry)."""

    def __init__(self, per_request: int = MAX_ENTRY_RESPONSES) -> None:
        self.streams: list[str] = []
        """Each entry's stream, in order (1-based indexes: ``place``'s answers)."""
        self._per_request = per_request
        self._latest: dict[str, int] = {}
        self._counts: dict[tuple[int, str], int] = {}

    def place(self, stream: str, request_id: str) -> int:
        """The (1-based) entry of ``stream`` that the next result of ``request_id`` joins."""
        entry = self._latest.get(stream)
        if entry is None or self._counts.get((entry, request_id), 0) >= self._per_request:
            self.streams.append(stream)
            entry = self._latest[stream] = len(self.streams)
        self._counts[entry, request_id] = self._counts.get((entry, request_id), 0) + 1
        return entry


class ResultWriter:
    """Writes results durably; retries while Redis is away (the caller holds the offsets)."""

    def __init__(self, redis: aioredis.Redis, settings: RedisSettings, names: Names) -> None:
        self._redis = redis
        self._settings = settings
        self._names = names
        self._cluster = is_cluster(redis)
        self._script = ChannelScript(redis, _WRITE_SCRIPT)
        self._bulk_limit: int | None = None
        """Redis' own ``proto-max-bulk-len``, once read (``_limit``)."""

    async def close(self) -> None:
        """Close the writer's own Redis connection (the client stays the caller's)."""
        await self._script.close()

    async def write(self, results: Results, states: Sequence[StateWrite] = ()) -> int:
        """Write (result, reply stream) pairs, and the sequences' ``states`` that go with
        them; returns how many results were first writes. A result over the largest value
        stored (``_limit``) is answered with an error in its place."""
        limit = await self._limit()
        payloads = [self._payload(result, limit) for result, _ in results]
        written = 0
        for start in range(0, len(results), _MAX_PER_CALL):
            end = start + _MAX_PER_CALL
            chunk = _states_in(states, start, end)
            written += await self._write_chunk(results[start:end], payloads[start:end], chunk)
        return written

    async def _limit(self) -> int:
        """The largest value stored: ``redis.max_result_bytes``, or Redis' own
        ``proto-max-bulk-len`` where that is smaller (the module doc); a Redis that does not
        tell (CONFIG refused) leaves the setting alone."""
        if self._bulk_limit is None:
            self._bulk_limit = await _proto_max_bulk_len(self._redis)
        return min(self._settings.max_result_bytes, self._bulk_limit)

    def _payload(self, result: InferResult, limit: int) -> bytes:
        """The bytes stored for ``result``: its encoding, or an error's over ``limit``."""
        payload, err = self._stored(result, limit)
        if err is not None:
            log.warning("request %s: %s; answered with that error", result.id, err.message)
        return payload

    def _stored(self, result: InferResult, limit: int) -> tuple[bytes, PayloadTooLarge | None]:
        payload = encode_result(result)
        if len(payload) <= limit:
            return payload, None
        what = (
            "redis.max_result_bytes"
            if limit == self._settings.max_result_bytes
            else "Redis' proto-max-bulk-len"
        )
        err = PayloadTooLarge(f"result of {len(payload)} bytes is over {what} ({limit})")
        return encode_result(error_in_place(result, err)), err

    async def stored_payloads(self, results: Sequence[InferResult]) -> list[bytes]:
        """The bytes a ``write`` of ``results`` stores for each (an error's in place of one
        over the limit), as ``AnsweredCheck.first_writes`` compares them with the keys'."""
        limit = await self._limit()
        return [self._stored(result, limit)[0] for result in results]

    async def _write_chunk(
        self, results: Results, payloads: list[bytes], states: Sequence[StateWrite] = ()
    ) -> int:
        if self._cluster:
            return await self._write_chunk_by_slot(results, payloads, states)
        entries = _Entries()
        keys: list[str] = []
        args: list[bytes | int | str] = [
            self._settings.result_ttl_s,
            self._settings.stream_maxlen,
            self._settings.reply_stream_ttl_s,
            len(results),
        ]
        for (result, stream), payload in zip(results, payloads, strict=True):
            keys.append(self._names.answer_key(result.id, result.index, result.final))
            args.append(payload)
            args.append(entries.place(stream, result.id) if stream else 0)
        keys.extend(entries.streams)
        if states:
            args.append(len(states))
            for w in states:
                args += [w.index + 1, w.state or b"", w.ttl_ms]
            keys.extend(w.key for w in states)
        written, lost, error = await self._script(keys, args)
        if lost:
            # Their result keys hold the answers (pollable); only the stream copy is gone.
            log.warning("%d results not added to their reply stream: %r", lost, error)
        return int(written)

    async def _write_chunk_by_slot(
        self, results: Results, payloads: list[bytes], states: Sequence[StateWrite] = ()
    ) -> int:
        """The cluster path: every command of it touches one key (see the module doc)."""
        ttl = self._settings.result_ttl_s
        state_of = {w.index: w for w in states}
        pipe = self._redis.pipeline(transaction=False)
        for i, ((result, _), payload) in enumerate(zip(results, payloads, strict=True)):
            key = self._names.answer_key(result.id, result.index, result.final)
            w = state_of.get(i)
            if w is None:
                pipe.eval(_CLAIM_SCRIPT, 1, key, payload, ttl)
                continue
            slot_key = self._names.answer_state_key(result.id)
            args = (payload, ttl, w.state or b"", w.ttl_ms)
            pipe.eval(_CLAIM_WITH_STATE_SCRIPT, 2, key, slot_key, *args)
        won = [int(claimed) for claimed in await pipe.execute()]
        outcomes = zip(results, payloads, won, strict=True)
        placed = [(stream, r.id, payload) for (r, stream), payload, first in outcomes if first]
        await self._add_to_streams(_stream_entries(placed))
        kept = [w for w in states if won[w.index]]
        if kept:
            pipe = self._redis.pipeline(transaction=False)
            for w in kept:
                if w.state is None:
                    pipe.delete(w.key)
                else:
                    pipe.set(w.key, w.state, px=w.ttl_ms)
            await pipe.execute()
        return sum(1 for first in won if first)

    async def resend(self, answers: Sequence[StoredAnswer]) -> None:
        """Add ``answers``, stored already, to their reply streams again, in order and byte
        for byte as stored (the entries, bound and expiry of a write; no key written):
        one pipelined call."""
        placed = [(a.stream, a.request_id, a.payload) for a in answers]
        await self._add_to_streams(_stream_entries(placed))

    async def _add_to_streams(self, entries: list[tuple[str, list[bytes]]]) -> None:
        """One entry each, in order (a stream's entries keep its results' order)."""
        if not entries:
            return
        pipe = self._redis.pipeline(transaction=False)
        for stream, payloads in entries:
            args = [self._settings.stream_maxlen, self._settings.reply_stream_ttl_s]
            pipe.eval(_STREAM_SCRIPT, 1, stream, *args, len(payloads), join_results(payloads))
        errors = await pipe.execute()
        for (stream, payloads), error in zip(entries, errors, strict=True):
            if error:
                log.warning(
                    "%d results not added to their reply stream: %r",
                    len(payloads),
                    f"{stream}: {error!r}",
                )

    async def write_until_done(
        self,
        results: Results,
        stop: asyncio.Event | None = None,
        states: Sequence[StateWrite] = (),
    ) -> int:
        """``write``, retried with backoff until Redis takes it (or ``stop`` is set); a
        result that Redis refuses for good is answered with an error (``_write_isolating``)."""
        what = f"writing {len(results)} results"

        async def attempt() -> int:
            try:
                return await self._write_isolating(results, states)
            except Exception:
                self._bulk_limit = None  # read again: a changed limit may be the cause
                raise

        return await until_done(attempt, what, stop)

    async def _write_isolating(self, results: Results, states: Sequence[StateWrite]) -> int:
        """``write``; where Redis refuses it for good, each half on its own, in order (a
        stream's results keep their order), down to the result that Redis refuses."""
        try:
            return await self.write(results, states)
        except ResponseError as exc:
            if not refused_for_good(exc) or not results:
                raise
            self._bulk_limit = None  # read again: a value over it may be what Redis refused
            if len(results) == 1:
                return await self._write_refused(results[0], states, exc)
        mid = len(results) // 2
        head = await self._write_isolating(results[:mid], _states_in(states, 0, mid))
        tail = _states_in(states, mid, len(results))
        return head + await self._write_isolating(results[mid:], tail)

    async def _write_refused(
        self, refused: tuple[InferResult, str | None], states: Sequence[StateWrite], exc: Exception
    ) -> int:
        """Answer a result that Redis refused with an error in its place, with its
        sequence's state; without that state where Redis refuses the state too. An error
        answer refused for good as well is raised (retried: the refusal is not the
        result's)."""
        result, stream = refused
        err = PlazaError(f"Redis refused to store the result: {exc}")
        log.error("request %s: %s; answered with that error", result.id, err.message)
        answer = [(error_in_place(result, err), stream)]
        try:
            return await self.write(answer, states)
        except ResponseError as again:
            if not states or not refused_for_good(again):
                raise
        log.error("request %s: Redis refused its sequence's state too; not kept", result.id)
        return await self.write(answer, [dataclasses.replace(w, state=None) for w in states])


async def _proto_max_bulk_len(redis: aioredis.Redis) -> int:
    """Redis' ``proto-max-bulk-len``; no limit where CONFIG GET is refused or tells none
    (a lost connection is raised: the write it precedes fails with it)."""
    try:
        reply: Any = await redis.config_get(_BULK_LIMIT)
    except ResponseError as exc:
        log.info("Redis does not tell its %s (%s): redis.max_result_bytes alone", _BULK_LIMIT, exc)
        return sys.maxsize
    value: Any = None
    if isinstance(reply, dict):
        value = reply.get(_BULK_LIMIT, reply.get(_BULK_LIMIT.encode()))
    try:
        return int(value) if value is not None else sys.maxsize
    except ValueError:
        return sys.maxsize


def _stream_entries(
    placed: Sequence[tuple[str | None, str, bytes]],
) -> list[tuple[str, list[bytes]]]:
    """(stream, request id, payload) triples, in order, as the stream entries that carry
    them (``_Entries``); those without a stream left out."""
    entries = _Entries()
    joined: dict[int, list[bytes]] = {}
    for stream, request_id, payload in placed:
        if stream:
            joined.setdefault(entries.place(stream, request_id), []).append(payload)
    return [(entries.streams[i - 1], joined[i]) for i in joined]


def _states_in(states: Sequence[StateWrite], start: int, end: int) -> list[StateWrite]:
    """The states of results ``start`` to ``end`` (excluded), indexed from ``start``."""
    return [dataclasses.replace(w, index=w.index - start) for w in states if start <= w.index < end]


def error_in_place(result: InferResult, err: PlazaError) -> InferResult:
    """``result`` answered with ``err`` instead: the same request, response and worker."""
    return msgspec.structs.replace(
        result, outputs=(), error=ErrorInfo(err.code, err.message), parameters=NO_PARAMETERS
    )
