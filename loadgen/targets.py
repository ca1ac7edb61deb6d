"""Where load goes: the gateway over HTTP (JSON or binary tensors), or Kafka via the SDK.

A target sends one request from its input pool per ``send`` and says how it went. The Kafka
target gets each result's ``timing_us`` (queue / compute split, filled by the worker); the
HTTP targets read the server's split from ``/v2/models/{m}/stats`` (Triton's statistics
extension) when the gateway serves it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from plaza.connections import redis_client
from plaza.loadgen.http_client import (
    EncodedRequest,
    HttpTransport,
    binary_request,
    json_request,
    open_transport,
    response_header,
)
from plaza.loadgen.inputs import InputSet
from plaza.loadgen.sequences import SequenceSteps
from plaza.loadgen.summary import ServerSplit
from plaza.settings import PlazaSettings

TargetKind = Literal["http-json", "http-binary", "kafka"]
TARGET_KINDS: tuple[TargetKind, ...] = ("http-json", "http-binary", "kafka")
STATS_PHASES = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Cumulative server statistics (Triton's statistics extension), summed over versions."""

    phases: dict[str, tuple[int, int]]
    """inference_stats phase -> (count, total ns)."""
    batches: dict[int, int]
    """Batch size -> executions."""
    busy_ns: int = 0
    """Time the backend spent executing batches (sum over executions of compute_infer)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's fate."""

    ok: bool
    timing_us: Mapping[str, int] = field(default_factory=dict)
    worker: str = ""
    error: str = ""


class Target(Protocol):
    label: str

    async def start(self) -> None: ...

    async def send(self) -> Outcome: ...

    async def stats(self) -> StatsSnapshot | None:
        """Cumulative server statistics, or None when the server has none."""
        ...

    async def stop(self) -> None: ...


class HttpTarget:
    """POST ``{url}/v2/models/{model}/infer`` with pre-encoded bodies (a stateful model's,
    with ``sequence_length``: encoded per request, since each names its place in a
    sequence)."""

    def __init__(
        self,
        url: str,
        model: str,
        pool: Sequence[InputSet],
        *,
        binary: bool,
        version: str = "",
        max_connections: int = 256,
        timeout_s: float = 30.0,
        label: str = "",
        sequence_length: int = 0,
    ) -> None:
        base = f"{url.rstrip('/')}/v2/models/{model}"
        self._base = base
        self._infer_url = f"{base}/versions/{version}/infer" if version else f"{base}/infer"
        self._encode = binary_request if binary else json_request
        self._pool = list(pool)
        self._sequences = SequenceSteps(sequence_length) if sequence_length else None
        encoded = [] if self._sequences else [self._encode(inputs) for inputs in pool]
        self._bodies: list[EncodedRequest] = encoded
        self._next = itertools.cycle(range(len(self._pool)))
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._transport: HttpTransport | None = None
        self._stats_transport: HttpTransport | None = None
        self._stats_available = True
        self.label = label or ("http-binary" if binary else "http-json")

    async def start(self) -> None:
        self._transport = open_transport(self._max_connections, self._timeout_s)
        # Its own connection: a GET queued behind the load's busy pool would wait for ages.
        self._stats_transport = open_transport(1, 5.0)

    async def send(self) -> Outcome:
        if self._sequences is None:
            return await self._post(self._bodies[next(self._next)])
        slot, params = self._sequences.take()
        outcome = await self._post(self._encode(self._pool[next(self._next)], parameters=params))
        self._sequences.give_back(slot, outcome.ok)
        return outcome

    async def _post(self, req: EncodedRequest) -> Outcome:
        assert self._transport is not None, "start() first"
        try:
            resp = await self._transport.post(self._infer_url, req.body, req.headers)
        except Exception as exc:  # connection refused, reset, timeout: an error sample
            return Outcome(False, error=f"{type(exc).__name__}: {exc}")
        if resp.status != 200:
            return Outcome(False, error=f"HTTP {resp.status}: {resp.body[:200]!r}")
        try:
            doc = response_header(resp.body, resp.headers)
        except ValueError as exc:
            return Outcome(False, error=f"bad response: {exc}")
        return Outcome("outputs" in doc, error="" if "outputs" in doc else "no outputs")

    async def stats(self) -> StatsSnapshot | None:
        if self._stats_transport is None or not self._stats_available:
            return None
        try:
            resp = await self._stats_transport.get(f"{self._base}/stats")
        except Exception:  # a transient failure: ask again next window
            return None
        if resp.status in (404, 405):  # no statistics extension: stop asking
            self._stats_available = False
            return None
        try:
            return parse_triton_stats(orjson.loads(resp.body)) if resp.status == 200 else None
        except orjson.JSONDecodeError:
            return None

    async def stop(self) -> None:
        for transport in (self._transport, self._stats_transport):
            if transport is not None:
                await transport.close()
        self._transport = self._stats_transport = None


class KafkaTarget:
    """``PlazaClient.infer``: publish to the model's topic, await the answer from Redis."""

    def __init__(
        self,
        settings: PlazaSettings,
        model: str,
        pool: Sequence[InputSet],
        *,
        timeout_s: float = 30.0,
        label: str = "kafka",
        sequence_length: int = 0,
    ) -> None:
        self._sequences = SequenceSteps(sequence_length) if sequence_length else None
        self._settings = settings
        self._model = model
        self._pool = list(pool)
        self._next = itertools.cycle(range(len(self._pool)))
        self._timeout_s = timeout_s
        self._client: Any = None
        self._redis: Any = None
        self._stats_keys: list[str] = []
        self.label = label

    async def start(self) -> None:
        from plaza.client import PlazaClient

        client = PlazaClient(self._settings)
        await client.start()  # a start that fails closes what it opened: nothing to stop
        self._client = client
        self._redis = redis_client(self._settings.redis)
        self._stats_keys = self._statistics_keys()

    async def send(self) -> Outcome:
        assert self._client is not None, "start() first"
        inputs = self._pool[next(self._next)]
        slot, params = self._sequences.take() if self._sequences else (None, None)
        outcome = await self._infer(inputs, params)
        if self._sequences is not None and slot is not None:
            self._sequences.give_back(slot, outcome.ok)
        return outcome

    async def _infer(self, inputs: InputSet, params: dict[str, Any] | None) -> Outcome:
        try:
            result = await self._client.infer(
                self._model,
                inputs,
                timeout_s=self._timeout_s,
                raise_on_error=False,
                parameters=params,
            )
        except Exception as exc:  # Unavailable, DeadlineExceeded
            return Outcome(False, error=f"{type(exc).__name__}: {exc}")
        if result.error is not None:
            error = f"{result.error.code}: {result.error.message}"  # the code alone hides why
            return Outcome(False, result.timing_us, result.worker, error)
        return Outcome(True, result.timing_us, result.worker)

    async def stats(self) -> StatsSnapshot | None:
        """The workers' statistics hashes in Redis (what the gateway's stats API serves)."""
        if self._redis is None or not self._stats_keys:
            return None
        try:
            from plaza.statistics import ModelStatistics

            pipe = self._redis.pipeline(transaction=False)
            for key in self._stats_keys:
                pipe.hgetall(key)
            raws = await pipe.execute()
            doc = {
                "model_stats": [
                    ModelStatistics.from_fields(r).to_triton(self._model, "") for r in raws
                ]
            }
        except Exception:  # no statistics in this Plaza, or Redis away: no split from them
            return None
        return parse_triton_stats(doc)

    def _statistics_keys(self) -> list[str]:
        """One hash per version on disk in ``settings.repository`` (none if unreadable)."""
        try:
            from plaza.repository import ModelRepository

            versions = ModelRepository(self._settings.repository).available_versions(self._model)
            names = self._settings.names
            return [names.model_stats_key(self._model, str(v)) for v in versions]
        except Exception:  # no repository here, or a Plaza without statistics
            return []

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.stop()
            self._client = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None


def parse_triton_stats(doc: Any) -> StatsSnapshot | None:
    """Sum ``model_stats[*]`` of a Triton statistics response (None if it is not one)."""
    phases = dict.fromkeys(STATS_PHASES, (0, 0))
    batches: dict[int, int] = {}
    busy = 0
    try:
        for m in doc["model_stats"]:
            stats = m["inference_stats"]
            for part in STATS_PHASES:
                c, n = phases[part]
                entry = stats.get(part, {})
                phases[part] = (c + int(entry.get("count", 0)), n + int(entry.get("ns", 0)))
            for b in m.get("batch_stats", ()):
                size = int(b["batch_size"])
                batches[size] = batches.get(size, 0) + int(b["compute_infer"]["count"])
                busy += int(b["compute_infer"].get("ns", 0))
    except (KeyError, TypeError, ValueError):
        return None
    return StatsSnapshot(phases, batches, busy)


def batches_between(
    before: StatsSnapshot | None, after: StatsSnapshot | None
) -> dict[int, int] | None:
    """Executions per batch size between two snapshots."""
    if before is None or after is None:
        return None
    moved = {k: v - before.batches.get(k, 0) for k, v in after.batches.items()}
    return {k: v for k, v in sorted(moved.items()) if v > 0}


def split_between(before: StatsSnapshot | None, after: StatsSnapshot | None) -> ServerSplit | None:
    """Mean per-request server time between two snapshots (None if either is missing)."""
    if before is None or after is None:
        return None
    count = after.phases["success"][0] - before.phases["success"][0]
    if count <= 0:
        return None

    def mean_us(part: str) -> float:
        return (after.phases[part][1] - before.phases[part][1]) / count / 1e3

    return ServerSplit(
        count,
        mean_us("queue"),
        mean_us("compute_input"),
        mean_us("compute_infer"),
        mean_us("compute_output"),
    )


def make_target(
    kind: TargetKind,
    model: str,
    pool: Sequence[InputSet],
    *,
    url: str = "http://127.0.0.1:8000",
    settings: PlazaSettings | None = None,
    max_connections: int = 256,
    timeout_s: float = 30.0,
    sequence_length: int = 0,
) -> Target:
    """A target of ``kind`` for ``model`` (``sequence_length``: a stateful model's, each
    concurrent client running sequences of that many requests)."""
    if kind == "kafka":
        return KafkaTarget(
            settings or PlazaSettings(),
            model,
            pool,
            timeout_s=timeout_s,
            sequence_length=sequence_length,
        )
    if kind not in ("http-json", "http-binary"):
        raise ValueError(f"unknown target {kind!r} (one of {', '.join(TARGET_KINDS)})")
    return HttpTarget(
        url,
        model,
        pool,
        binary=kind == "http-binary",
        max_connections=max_connections,
        timeout_s=timeout_s,
        sequence_length=sequence_length,
    )
