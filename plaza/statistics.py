"""Triton's model statistics: the numbers, their Redis hash form, their JSON form.

Workers run the models, so workers count; the gateway answers Triton's statistics API. They
meet in Redis: one hash per model version (``Names.model_stats_key``) holding cumulative
counters. Each worker keeps its totals in memory (``ModelStatistics``) and, with every
heartbeat, adds what changed since its last flush (``HINCRBY``, in ``FLUSH_SCRIPT``), so the
hash is the sum over every worker that ever served the version. ``last_inference`` is the
maximum instead of a sum. The gateway reads the hash back (``from_fields``) and renders
Triton's JSON (``to_triton``).

The response cache's hits and misses (``cache_hit``, ``cache_miss``) never reach a worker:
the producer core that looked them up (a gateway's, an SDK client's) adds them to the same
hash, every ``plaza.response_cache.STATS_FLUSH_S``; a hit also counts as a success, as in
Triton (whose ``success`` includes cache hits and whose ``inference_count`` does not).

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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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

# KEYS: one statistics hash per model version, all of one model (a worker's versions, or one
# hash): they share the model's hash tag, so on a Redis Cluster the call stays in one slot.
# ARGV: ttl, then per key: last inference (epoch ms), n, then n (field, increment) pairs.
FLUSH_SCRIPT = """
local ttl = ARGV[1]
local at = 2
for k = 1, #KEYS do
  local key, last, n = KEYS[k], tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  at = at + 2
  for _ = 1, n do
    redis.call('HINCRBY', key, ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  if last > tonumber(redis.call('HGET', key, 'last_inference') or '0') then
    redis.call('HSET', key, 'last_inference', last)
  end
  redis.call('EXPIRE', key, ttl)
end
return #KEYS
"""


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
    """Failed requests by Triton's reason (REJECTED, BACKEND, OTHER)."""
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


def flush_arguments(
    changes: list[tuple[str, int, dict[str, int]]], ttl_s: int
) -> tuple[list[str], list[int | str]]:
    """KEYS and ARGV of ``FLUSH_SCRIPT`` for (key, last inference, increments) triples."""
    keys: list[str] = []
    args: list[int | str] = [ttl_s]
    for key, last, increments in changes:
        keys.append(key)
        args += [last, len(increments)]
        for name, amount in increments.items():
            args += [name, amount]
    return keys, args


def increments(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """What to add to the hash: the counters that moved since ``before`` (not last_inference)."""
    return {
        name: value - before.get(name, 0)
        for name, value in now.items()
        if name != LAST_INFERENCE and value != before.get(name, 0)
    }
