"""Triton's model statistics: the numbers, their Redis hash form, their JSON form.

Workers run the models, so workers count; the gateway answers Triton's statistics API. They
meet in Redis: one hash per model version (``Names.model_stats_key``) holding cumulative
counters. Each worker keeps its totals in memory (``ModelStatistics``) and, with every
heartbeat, adds what changed since its last flush (``HINCRBY``, in
``SEQUENCED_FLUSH_SCRIPT``, each change once however its call ends: ``FlushLog``), so the
hash is the sum over every worker that ever served the version. ``last_inference`` is the
maximum instead of a sum. The gateway reads the hash back (``from_fields``) and renders
Triton's JSON (``to_triton``).

The response cache's hits and misses (``cache_hit``, ``cache_miss``) never reach a worker:
the producer core that looked them up (a gateway's, an SDK client's) adds them to the same
hash, every ``plaza.response_cache.STATS_FLUSH_S``, by the same ``SEQUENCED_FLUSH_SCRIPT`` (a
``FlushLog`` and marker per model: ``plaza.response_cache.CacheFlushes``); a hit also counts
as a success, as in Triton (whose ``success`` includes cache hits and whose
``inference_count`` does not).

Hash fields: ``inference_count``, ``execution_count``, ``last_inference`` (epoch ms),
``<phase>.count`` / ``<phase>.ns`` for the phases success, fail, queue, compute_input,
compute_infer, compute_output, cache_hit, cache_miss, ``failure.<REASON>`` (failed
requests by Triton's reason), and ``batch.<size>.<phase>.count`` / ``.ns`` for the
compute phases of each batch size.

A decoupled model's requests get Triton's ``response_stats`` too: per response index (0 for
a request's first response, 1 for its second, ...), how many responses at that index
succeeded, failed, were cancelled or were empty finals, with their times
(``ResponseStatistics``); hash fields ``response.<index>.<phase>.count`` / ``.ns``. Every
other model has none, and its JSON an empty ``response_stats``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plaza.naming import Names

LAST_INFERENCE = "last_inference"
REQUEST_PHASES = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
"""The ``inference_stats`` entries, in Triton's order."""
COMPUTE_PHASES = ("compute_input", "compute_infer", "compute_output")
"""The entries of each ``batch_stats`` element."""
RESPONSE_PHASES = (
    "compute_infer",
    "compute_output",
    "success",
    "fail",
    "empty_response",
    "cancel",
)
"""The entries of each ``response_stats`` element (Triton's InferResponseStatistics)."""

# One hash's part of ARGV: its last inference (epoch ms), n, then n (field,
# increment) pairs. ``add`` applies the part at ARGV[at]; ``skip`` passes it over. Each
# returns where the next part starts.
_PARTS = """
local function add(key, at)
  local last, n = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  for i = at + 2, at + 2 * n, 2 do
    redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1])
  end
  if last > tonumber(redis.call('HGET', key, 'last_inference') or '0') then
    redis.call('HSET', key, 'last_inference', last)
  end
  return at + 2 + 2 * n
end
local function skip(at)
  return at + 2 + 2 * tonumber(ARGV[at + 1])
end
"""

# A flush (a worker's heartbeat, the response cache's), applied at most once however often
# it is sent (``FlushLog``).
# KEYS: the statistics hashes of one model, then the flusher's marker (``flusher_key``): the
# sequence number of the last flush of this flusher that was applied. All share the model's
# hash tag. ARGV: ttl, the number of flushes, then per flush: its sequence number, its
# number of parts m, and m times a key's index in KEYS followed by that key's part. A flush
# whose number is not above the marker's was applied before: it is passed over.
SEQUENCED_FLUSH_SCRIPT = (
    _PARTS
    + """
local ttl, flushes = ARGV[1], tonumber(ARGV[2])
local marker = KEYS[#KEYS]
local applied = tonumber(redis.call('GET', marker) or '0')
local at = 3
for _ = 1, flushes do
  local seq, m = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  at = at + 2
  for _ = 1, m do
    if seq > applied then
      at = add(KEYS[tonumber(ARGV[at])], at + 1)
    else
      at = skip(at + 1)
    end
  end
  if seq > applied then
    applied = seq
  end
end
for k = 1, #KEYS - 1 do
  redis.call('EXPIRE', KEYS[k], ttl)
end
redis.call('SET', marker, applied, 'EX', ttl)
return applied
"""
)


@dataclass(slots=True)
class Duration:
    """Triton's StatisticDuration: how many times, and how long in total (nanoseconds)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStatistics:
    """One batch size's executions: each compute phase once per execution."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStatistics:
    """The responses of one index within their requests (a decoupled model's), as
    Triton's InferResponseStatistics: each is a success, a failure (an error response), a
    cancellation (an error response with the code ``cancelled``) or an empty final (the
    final flag without a response). Every one counts in ``compute_infer``, the model's time
    from the response's start (the request's previous response, or its execution's start)
    to its send; a response with data or an error also counts in ``compute_output``, the
    worker's time making it ready. The outcome's ``ns`` is the two together."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def to_json(self) -> dict[str, dict[str, int]]:
        return {p: getattr(self, p).to_json() for p in RESPONSE_PHASES}


@dataclass(slots=True)
class ModelStatistics:
    """Cumulative statistics of one model version (one worker's, or the sum of all)."""

    inference_count: int = 0
    """Inferences run: a batch of n rows counts n (Triton's inference_count)."""
    execution_count: int = 0
    """Backend executions (batches run)."""
    last_inference: int = 0
    """When a request of this version was last answered, epoch milliseconds; 0: never."""
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    """Response cache hits (lookup time); counted by producers, not workers."""
    cache_miss: Duration = field(default_factory=Duration)
    """Response cache misses (lookup and store time); counted by producers."""
    failures: dict[str, int] = field(default_factory=dict)
    """Failed requests by Triton's reason (REJECTED, BACKEND, CANCELED, OTHER)."""
    batches: dict[int, BatchStatistics] = field(default_factory=dict)
    """Executions by batch size (rows)."""
    responses: dict[int, ResponseStatistics] = field(default_factory=dict)
    """A decoupled model's responses by their index within their requests."""

    def phase(self, name: str) -> Duration:
        """The ``inference_stats`` entry called ``name``."""
        value = getattr(self, name)
        assert isinstance(value, Duration)
        return value

    def batch(self, size: int) -> BatchStatistics:
        """The entry of batch size ``size``, created empty if new."""
        entry = self.batches.get(size)
        if entry is None:
            entry = self.batches[size] = BatchStatistics()
        return entry

    def response(self, index: int) -> ResponseStatistics:
        """The entry of response index ``index``, created empty if new."""
        entry = self.responses.get(index)
        if entry is None:
            entry = self.responses[index] = ResponseStatistics()
        return entry

    # -- the Redis hash -------------------------------------------------------------------
    def fields(self) -> dict[str, int]:
        """The hash fields, every counter as it stands (thread-safe enough to snapshot)."""
        out = {
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            LAST_INFERENCE: self.last_inference,
        }
        for name in REQUEST_PHASES:
            d = self.phase(name)
            out[f"{name}.count"], out[f"{name}.ns"] = d.count, d.ns
        for reason, count in dict(self.failures).items():
            out[f"failure.{reason}"] = count
        for size, entry in dict(self.batches).items():
            for name in COMPUTE_PHASES:
                d = getattr(entry, name)
                out[f"batch.{size}.{name}.count"], out[f"batch.{size}.{name}.ns"] = d.count, d.ns
        for index, response in dict(self.responses).items():
            for name in RESPONSE_PHASES:
                d = getattr(response, name)
                key = f"response.{index}.{name}"
                out[f"{key}.count"], out[f"{key}.ns"] = d.count, d.ns
        return out

    @classmethod
    def from_fields(cls, raw: Mapping[Any, Any]) -> ModelStatistics:
        """Parse a hash as HGETALL returns it (bytes or str); unknown fields are ignored."""
        stats = cls()
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            stats._set(name, int(value))
        return stats

    def _set(self, name: str, value: int) -> None:
        head, _, rest = name.partition(".")
        if name in ("inference_count", "execution_count", LAST_INFERENCE):
            setattr(self, name, value)
        elif head in REQUEST_PHASES and rest in ("count", "ns"):
            setattr(self.phase(head), rest, value)
        elif head == "failure" and rest:
            self.failures[rest] = value
        elif head in ("batch", "response"):
            number, _, tail = rest.partition(".")
            phase, _, unit = tail.partition(".")
            if not number.isdigit() or unit not in ("count", "ns"):
                return
            if head == "batch" and phase in COMPUTE_PHASES:
                setattr(getattr(self.batch(int(number)), phase), unit, value)
            elif head == "response" and phase in RESPONSE_PHASES:
                setattr(getattr(self.response(int(number)), phase), unit, value)

    # -- Triton's JSON --------------------------------------------------------------------
    def to_triton(self, name: str, version: str) -> dict[str, Any]:
        """One element of Triton's ``model_stats`` array."""
        inference = {p: self.phase(p).to_json() for p in REQUEST_PHASES}
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": inference,
            "batch_stats": [
                {
                    "batch_size": size,
                    **{p: getattr(entry, p).to_json() for p in COMPUTE_PHASES},
                }
                for size, entry in sorted(self.batches.items())
            ],
            "memory_usage": [],
            "response_stats": {
                str(index): entry.to_json() for index, entry in sorted(self.responses.items())
            },
        }


Change = tuple[str, int, dict[str, int]]
"""A statistics hash's key, its last inference (epoch ms) and what to add to its fields."""

MAX_UNCONFIRMED_FLUSHES = 8
"""A ``FlushLog`` holds at most this many flushes whose reply never came; past it, a flush
sends those again and nothing new (which waits, counted, for their reply)."""


def _part(last: int, increments: Mapping[str, int]) -> list[int | str]:
    part: list[int | str] = [last, len(increments)]
    for name, amount in increments.items():
        part += [name, amount]
    return part


def flusher_key(names: Names, model: str, flusher: str) -> str:
    """The marker of ``flusher``'s applied flushes (``SEQUENCED_FLUSH_SCRIPT``): named as a
    statistics hash of ``model`` whose version no model has, so it shares the model's hash
    tag (and slot) and readers, who ask for served versions only, never meet it."""
    return names.model_stats_key(model, f"flusher:{flusher}")


@dataclass(slots=True)
class FlushLog:
    """One flusher's way of adding its totals to the statistics hashes exactly once.

    Each flush is the change since the previous one, under the next sequence number; it
    stays here until a reply shows Redis ran the call that carried it, and every call
    carries all the flushes still here. The script applies a flush only when its number is
    above the flusher's marker, so a flush that ran but whose reply was lost (a cancelled
    heartbeat, a dropped connection, a client's retry) is passed over when sent again, and
    one that never ran is applied then, before the newer ones: the hashes always hold the
    totals of the marker's flush.
    """

    flusher: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This flusher's id: new for every ``WorkerMetrics`` (a worker id may be reused by a
    worker started again, whose numbers start again from 1)."""
    seq: int = 0
    """The newest flush's sequence number (0: none yet)."""
    sent: dict[str, dict[str, int]] = field(default_factory=dict)
    """The fields of each hash as of the newest flush (what the next one counts from)."""
    unconfirmed: list[tuple[int, list[Change]]] = field(default_factory=list)
    """The flushes not known to be applied, oldest first."""

    def add(self, totals: Mapping[str, Mapping[str, int]]) -> None:
        """Log a flush of ``totals`` (fields by statistics hash key): the change since the
        newest one. Nothing when ``MAX_UNCONFIRMED_FLUSHES`` are unconfirmed already."""
        if len(self.unconfirmed) >= MAX_UNCONFIRMED_FLUSHES or not totals:
            return
        changes = [
            (key, fields.get(LAST_INFERENCE, 0), increments(fields, self.sent.get(key, {})))
            for key, fields in totals.items()
        ]
        self.seq += 1
        self.unconfirmed.append((self.seq, changes))
        self.sent = {key: dict(fields) for key, fields in totals.items()}

    def confirmed(self, through: int) -> None:
        """A call that carried the unconfirmed flushes up to number ``through`` has run:
        Redis holds those (applied by this call or before it)."""
        self.unconfirmed = [(seq, c) for seq, c in self.unconfirmed if seq > through]

    def arguments(self, marker: str, ttl_s: int) -> tuple[list[str], list[int | str]]:
        """KEYS and ARGV of ``SEQUENCED_FLUSH_SCRIPT`` for every unconfirmed flush."""
        index: dict[str, int] = {}
        for _, changes in self.unconfirmed:
            for key, _, _ in changes:
                index.setdefault(key, len(index) + 1)
        args: list[int | str] = [ttl_s, len(self.unconfirmed)]
        for seq, changes in self.unconfirmed:
            args += [seq, len(changes)]
            for key, last, delta in changes:
                args += [index[key], *_part(last, delta)]
        return [*index, marker], args


def increments(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """What to add to the hash: the counters that moved since ``before`` (not last_inference)."""
    return {
        name: value - before.get(name, 0)
        for name, value in now.items()
        if name != LAST_INFERENCE and value != before.get(name, 0)
    }
