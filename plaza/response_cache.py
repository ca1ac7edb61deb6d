"""Triton's response cache, kept in Redis: a repeated request is answered without Kafka.

A model opts in with ``response_cache { enable: true }`` in its config.pbtxt. The producer
core (``plaza.producer``) asks ``ResponseCache.probe`` before publishing a synchronous or
streamed request: on a hit the stored answer comes back with the request's own id and
nothing is published; on a miss the request goes to Kafka as usual and its answer, when it
is a success, is stored (``ResponseCache.store``). Errors are never stored. Both are
bounded by the call's time: a Redis that does not answer the lookup within it ends the call
(DeadlineExceeded, nothing published), and a store it does not take in time is dropped.

The key (``cache_key``) is a BLAKE2b digest over the model, the version that answers (the
request's, or its model's default: the newest loaded version where the caller knows what is
loaded, a gateway; else ``DefaultVersions``), every input's name, datatype, shape
and bytes (by input name, so their order does not matter), the requested outputs (in
order), every request parameter that reaches the worker, and the outputs to classify.

Bounds, per cached model: an entry lives ``response_cache.ttl_s`` seconds (Redis TTL); an
answer whose entry would pass ``response_cache.max_entry_bytes`` is not stored; and the
model's entries live in at most ``response_cache.max_entries`` keys. The cache is direct
mapped: a digest selects one of those slots (``Names.response_cache_key``), whose value
is the digest followed by the answer, so a slot holds one answer at a time and a lookup
whose digest differs is a miss. A model's cache therefore never holds more than
``max_entries * max_entry_bytes`` bytes of values, and each command touches one key
(no hash tag needed in Redis Cluster, like the result and job keys).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgpack
import redis.asyncio as aioredis

from plaza.codec import decode_result, encode_result
from plaza.contract import InferRequest, InferResult
from plaza.errors import DeadlineExceeded
from plaza.modelconfig import ModelSpec
from plaza.naming import Names
from plaza.repository import ModelRepository
from plaza.settings import ResponseCacheSettings
from plaza.statistics import (
    LAST_INFERENCE,
    MAX_UNCONFIRMED_FLUSHES,
    SEQUENCED_FLUSH_SCRIPT,
    FlushLog,
    flusher_key,
)
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

DIGEST_BYTES = 32
"""Length of a cache key digest (BLAKE2b-256); a stored entry starts with it."""
_PERSON = b"plaza-cache-v1"
"""BLAKE2b personalisation: a change of the key rule changes every key."""
VERSIONS_TTL_S = 1.0
"""How long the version folders read from the repository are reused (one model)."""
STATS_FLUSH_S = 1.0
"""How often counted hits and misses are added to the statistics hashes."""
STATS_PENDING_MAX = 4096
"""Model versions whose counts may wait for a flush, and whose totals the flushes keep;
past it, new ones are not counted (bounded by the repository in practice: label values
come only from specs)."""


def _frame(h: hashlib.blake2b, part: bytes | bytearray | memoryview) -> None:
    """Add one length-prefixed field, so that no two field sequences hash alike."""
    h.update(struct.pack("<Q", memoryview(part).nbytes))
    h.update(part)


def cache_key(req: InferRequest, version: str) -> bytes:
    """The digest of what decides ``req``'s answer from the model's ``version``."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=_PERSON)
    _frame(h, req.model.encode())
    _frame(h, version.encode())
    inputs = sorted(req.inputs, key=lambda t: t.name)
    h.update(struct.pack("<Q", len(inputs)))
    for t in inputs:
        _frame(h, t.name.encode())
        _frame(h, t.datatype.encode())
        _frame(h, struct.pack(f"<{len(t.shape)}q", *t.shape))
        _frame(h, t.data)
    _frame(h, msgpack.packb(list(req.outputs)))
    _frame(h, msgpack.packb(sorted(req.parameters.items())))
    if req.classification:  # absent from most requests: their keys stay as they were
        _frame(h, msgpack.packb(sorted(req.classification.items())))
    return h.digest()


def slot_of(digest: bytes, max_entries: int) -> int:
    """Which of a model's ``max_entries`` slots the digest maps to."""
    return int.from_bytes(digest[:8], "little") % max_entries


def encode_entry(digest: bytes, result: InferResult) -> bytes:
    """A slot's value: the digest, then the answer (its outputs, model, version and the
    model's response parameters only: no id, no timings, no worker, which belong to the
    request that computed it)."""
    kept = InferResult(
        id="",
        model=result.model,
        version=result.version,
        outputs=result.outputs,
        parameters=result.parameters,
    )
    return digest + encode_result(kept)


def decode_entry(entry: bytes, digest: bytes, request_id: str) -> InferResult | None:
    """The answer in ``entry`` with the request's own id; None when the slot holds another
    digest's answer (or something unreadable)."""
    if entry[:DIGEST_BYTES] != digest:
        return None
    try:
        stored = decode_result(entry[DIGEST_BYTES:])
    except Exception:  # a CodecError, or a foreign value: a miss, the next store replaces it
        return None
    return InferResult(
        id=request_id,
        model=stored.model,
        version=stored.version,
        outputs=stored.outputs,
        parameters=stored.parameters,
    )


class CacheObserver(Protocol):
    """Told of every hit and miss (the gateway's Prometheus counters)."""

    def cache_hit(self, model: str, version: str, seconds: float) -> None:
        """A lookup that found the answer; ``seconds``: the lookup."""

    def cache_miss(self, model: str, version: str, seconds: float) -> None:
        """A lookup that did not; ``seconds``: the lookup plus the store (if any)."""


@dataclass(slots=True)
class CacheProbe:
    """One lookup: what it was for and what it found (``hit``, None on a miss)."""

    req: InferRequest
    version: str
    """The version looked up (the request's, or its model's default)."""
    digest: bytes
    lookup_s: float
    hit: InferResult | None = None


class DefaultVersions:
    """The version a request without one is answered by, for a caller that cannot see what
    is loaded (an SDK client): the newest its model's version policy selects among the
    repository's version folders (read at most every ``VERSIONS_TTL_S`` per model). A
    gateway passes its loaded versions' newest instead: a folder staged but not loaded
    must not be asked for. If the folders change before the workers follow, a lookup may ask
    for a version that does not answer yet: a miss, never a wrong hit, since answers are
    stored under the version that computed them."""

    def __init__(
        self, root: Path, clock: Callable[[], float] = time.monotonic, config_name: str = ""
    ) -> None:
        self._repo = ModelRepository(root, config_name)
        self._clock = clock
        self._read: dict[str, tuple[float, list[int]]] = {}

    def __call__(self, spec: ModelSpec) -> str | None:
        now = self._clock()
        cached = self._read.get(spec.name)
        if cached is None or now - cached[0] >= VERSIONS_TTL_S:
            try:
                cached = (now, self._repo.available_versions(spec.name))
            except Exception:  # not readable here: this request is not cached
                return None
            self._read[spec.name] = cached
        served = spec.version_policy.select(cached[1])
        return str(max(served)) if served else None


class CacheStatistics:
    """Hits and misses counted since the last flush, as increments of Triton's statistics
    hash fields (``plaza.statistics``): a hit is a ``cache_hit`` and a ``success``, and
    answers a request of its version, so it also moves ``last_inference`` (epoch ms, by
    ``clock``: a maximum, never a sum)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.pending: dict[tuple[str, str], dict[str, int]] = {}
        self._clock = clock

    def _add(
        self, model: str, version: str, phases: tuple[str, ...], seconds: float
    ) -> dict[str, int] | None:
        counts = self.pending.get((model, version))
        if counts is None:
            if len(self.pending) >= STATS_PENDING_MAX:
                return None
            counts = self.pending[(model, version)] = {}
        for phase in phases:
            counts[f"{phase}.count"] = counts.get(f"{phase}.count", 0) + 1
            counts[f"{phase}.ns"] = counts.get(f"{phase}.ns", 0) + int(seconds * 1e9)
        return counts

    def hit(self, model: str, version: str, seconds: float) -> None:
        counts = self._add(model, version, ("cache_hit", "success"), seconds)
        if counts is not None:
            now_ms = int(self._clock() * 1000)
            counts[LAST_INFERENCE] = max(counts.get(LAST_INFERENCE, 0), now_ms)

    def miss(self, model: str, version: str, seconds: float) -> None:
        self._add(model, version, ("cache_miss",), seconds)

    def take(self) -> dict[tuple[str, str], dict[str, int]]:
        """The pending increments, handed over (and forgotten here)."""
        taken, self.pending = self.pending, {}
        return taken


Sent = list[tuple[FlushLog, int]]
"""The flush logs a pipeline carries, each with the newest flush number it carries."""


class CacheFlushes:
    """Counted hits and misses on their way to the statistics hashes, each added once
    however the call that carries it ends, as a worker's heartbeat flush
    (``plaza.statistics.FlushLog``, ``SEQUENCED_FLUSH_SCRIPT``): per model, the totals
    counted since start, a flush log of their changes and the log's marker. A flush whose
    reply does not come (an error, a cancelled flush, a lost reply that a client's retry
    sends again) is sent again with the next ones and applied once; nothing is lost and
    nothing counted twice."""

    def __init__(self, names: Names, ttl_s: int) -> None:
        self._names = names
        self._ttl_s = ttl_s
        self.totals: dict[str, dict[str, dict[str, int]]] = {}
        """Model -> its statistics hashes' keys -> each hash's fields counted so far."""
        self._kept = 0
        """Hashes in ``totals`` (``STATS_PENDING_MAX`` at most)."""
        self._logs: dict[str, FlushLog] = {}
        self._moved: set[str] = set()
        """Models whose totals changed since their log's newest flush."""

    @property
    def backlog(self) -> bool:
        """Whether a model's log is full of unconfirmed flushes (a flush sends only those)."""
        return any(len(log.unconfirmed) >= MAX_UNCONFIRMED_FLUSHES for log in self._logs.values())

    def fold(self, taken: dict[tuple[str, str], dict[str, int]]) -> None:
        """Add increments (``CacheStatistics.take``) to the totals."""
        for (model, version), counts in taken.items():
            key = self._names.model_stats_key(model, version)
            fields = self.totals.get(model, {}).get(key)
            if fields is None:
                if self._kept >= STATS_PENDING_MAX:
                    continue
                fields = self.totals.setdefault(model, {})[key] = {}
                self._kept += 1
            for name, amount in counts.items():
                if name == LAST_INFERENCE:  # a time: the newest wins
                    fields[name] = max(fields.get(name, 0), amount)
                else:
                    fields[name] = fields.get(name, 0) + amount
            self._moved.add(model)

    def queue(self, pipe: Any) -> Sent:
        """Log a flush of each model whose totals moved, then put one script call a model
        (its hashes share its hash tag) carrying its unconfirmed flushes on ``pipe``."""
        for model in sorted(self._moved):
            log = self._logs.setdefault(model, FlushLog())
            logged = log.seq
            log.add(self.totals[model])
            if log.seq != logged:  # else its backlog is full: the change waits, counted
                self._moved.discard(model)
        sent: Sent = []
        for model, log in self._logs.items():
            if log.unconfirmed:
                marker = flusher_key(self._names, model, log.flusher)
                keys, args = log.arguments(marker, self._ttl_s)
                pipe.eval(SEQUENCED_FLUSH_SCRIPT, len(keys), *keys, *args)
                sent.append((log, log.seq))
        return sent

    @staticmethod
    def confirm(sent: Sent, replies: list[Any]) -> None:
        """Confirm the flushes of each call that ran; raise the first call's error."""
        for (log, carried), reply in zip(sent, replies, strict=True):
            if not isinstance(reply, Exception):
                log.confirmed(carried)
        errors = [r for r in replies if isinstance(r, Exception)]
        if errors:
            raise errors[0]


class ResponseCache:
    """Lookups and stores of answers of the models that enable the cache.

    Counted hits and misses go to the models' statistics hashes from ``start`` to ``stop``
    (every ``STATS_FLUSH_S``; ``stats_ttl_s``: the hashes' idle expiry, as the workers').
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: ResponseCacheSettings,
        names: Names,
        default_version: Callable[[ModelSpec], str | None],
        observer: CacheObserver | None = None,
        *,
        stats_ttl_s: int = 7 * 86400,
    ) -> None:
        self._redis = redis
        self.settings = settings
        self._names = names
        self._default_version = default_version
        self._observer = observer
        self.statistics = CacheStatistics()
        self.flushes = CacheFlushes(names, stats_ttl_s)
        self._flusher: asyncio.Task[None] | None = None
        self.hits = 0
        self.misses = 0

    # -- statistics ------------------------------------------------------------------------
    def start(self) -> None:
        """Flush counted hits and misses every ``STATS_FLUSH_S`` until ``stop``."""
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_every())

    async def stop(self) -> None:
        """Stop flushing, after a last flush (bounded: Redis may be away; twice when the
        first only sends a full backlog of unconfirmed flushes)."""
        if self._flusher is not None:
            await cancel_and_wait([self._flusher])
            self._flusher = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(STATS_FLUSH_S):
                for _ in range(2):
                    backlog = self.flushes.backlog
                    await self.flush()
                    if not backlog:
                        break

    async def flush(self) -> None:
        """Add what was counted since the last flush to the statistics hashes, and send
        again what earlier flushes did not get confirmed (``CacheFlushes``): each once."""
        await self.flush_with(self._redis.pipeline(transaction=False))

    async def flush_with(self, pipe: Any) -> None:
        """``flush`` through ``pipe`` (a pipeline of the cache's Redis; the tests' seam)."""
        self.flushes.fold(self.statistics.take())
        sent = self.flushes.queue(pipe)
        if sent:
            self.flushes.confirm(sent, await pipe.execute(raise_on_error=False))

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(STATS_FLUSH_S)
            try:
                await self.flush()
            except Exception as exc:  # kept: the next flush sends them again
                log.warning("response cache: statistics flush failed: %s", exc)

    # -- lookups and stores ----------------------------------------------------------------

    def _key(self, model: str, digest: bytes) -> str:
        return self._names.response_cache_key(model, slot_of(digest, self.settings.max_entries))

    async def probe(
        self, req: InferRequest, spec: ModelSpec | None, timeout_s: float | None = None
    ) -> CacheProbe | None:
        """Look ``req`` up; None when its model does not cache (or its version is unknown
        here). A Redis failure is a miss: the request is published as without a cache. A
        lookup Redis has not answered within ``timeout_s`` (the call's time) is
        DeadlineExceeded: nothing was published, so a retry is safe."""
        if spec is None or not spec.response_cache:
            return None
        asked = req.version or self._default_version(spec) or ""
        if not (asked.isascii() and asked.isdigit()):  # a version no worker serves: no entry
            return None
        version = str(int(asked))  # one name per version: "01" is 1, as a worker reads it
        started = time.monotonic()
        digest = cache_key(req, version)
        entry: object = None
        bound = asyncio.timeout(None if timeout_s is None else max(timeout_s, 0.0))
        try:
            async with bound:
                entry = await self._redis.get(self._key(req.model, digest))
        except Exception as exc:
            if bound.expired():
                raise DeadlineExceeded(
                    f"the call's {timeout_s:g} s ran out during the response cache lookup "
                    "(Redis had not answered it); nothing was published"
                ) from exc
            log.warning("response cache: lookup failed (a miss): %s", exc)
        probe = CacheProbe(req, version, digest, time.monotonic() - started)
        if isinstance(entry, bytes):
            probe.hit = decode_entry(entry, digest, req.id)
        if probe.hit is not None:
            self.hits += 1
            self.statistics.hit(req.model, probe.hit.version, probe.lookup_s)
            if self._observer is not None:
                self._observer.cache_hit(req.model, probe.hit.version, probe.lookup_s)
        return probe

    async def store(
        self, probe: CacheProbe, result: InferResult, timeout_s: float | None = None
    ) -> None:
        """Store a miss's answer when it is a success that fits, within ``timeout_s`` (what
        is left of the call: past it the answer is not stored), and count the miss."""
        started = time.monotonic()
        if result.error is None and result.version:
            # Under the version that answered, which a later lookup for it must find (the
            # one looked up, unless the workers serve another default than the repository).
            digest = probe.digest
            if result.version != probe.version:
                digest = cache_key(probe.req, result.version)
            await self._put(probe.req.model, digest, result, timeout_s)
        self.missed(probe, time.monotonic() - started)

    def missed(self, probe: CacheProbe, store_s: float = 0.0) -> None:
        """Count a miss (with the time its store took, if any)."""
        self.misses += 1
        seconds = probe.lookup_s + store_s
        self.statistics.miss(probe.req.model, probe.version, seconds)
        if self._observer is not None:
            self._observer.cache_miss(probe.req.model, probe.version, seconds)

    async def _put(
        self, model: str, digest: bytes, result: InferResult, timeout_s: float | None
    ) -> None:
        entry = encode_entry(digest, result)
        if len(entry) > self.settings.max_entry_bytes:
            return
        bound = asyncio.timeout(None if timeout_s is None else max(timeout_s, 0.0))
        try:
            async with bound:
                await self._redis.set(self._key(model, digest), entry, ex=self.settings.ttl_s)
        except Exception as exc:  # the answer is already here; the cache is only a shortcut
            why = "the call's time ran out" if bound.expired() else str(exc)
            log.warning("response cache: store failed: %s", why)
