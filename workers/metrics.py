"""A worker's metrics: Triton's per model version counters, batch sizes, consumer lag, GPU.

The worker feeds one ``WorkerMetrics`` at three points and nothing else:
- ``executed(items, results)``: the runner's observer, once per backend execution that ran
  (each half of a failed batch retried in halves that ran is one; the calls that raised
  are none): inference and execution counts, batch sizes, per batch size compute times;
- ``answered(answers)``: after the writer made a batch of answers durable (request success
  and failure, queue and compute times per request), the first answers of their requests
  only (one that lost to an answer stored before it, a replay's, counts nothing here);
- ``cancelled(items)``: requests finished unrun because their callers cancelled them
  (failures of Triton's reason ``CANCELED``);
- ``responded(item, result, timing)``: a decoupled model's runner, once per response as the
  model sends it (Triton's ``response_stats`` and first-response histogram,
  ``workers/response_statistics.py``); no other model calls it;
- ``lags``: set by the scheduler whenever it computes consumer lag;
- ``count(outcome)``: what happened to the records it fetched (``RECORD_OUTCOMES``).

The hot path touches plain ints only. Prometheus reads them at scrape time through a
collector on the worker's own registry (served by ``plaza.metrics.MetricsServer`` on
``worker.metrics_port``), and the heartbeat adds what changed since the last beat to the
model version's statistics hash in Redis (``flush_with``), where the gateway's statistics
API reads the sum over all workers.

A host (several models in one process) serves one /metrics for all of them: its workers'
``WorkerMetrics`` join one ``MetricsHub``, whose registry holds one collector that renders
every family once, with a sample per model (label ``model``), and one GPU collector. A
worker on its own makes a private hub, so both cases are the same code.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from plaza.contract import InferResult
from plaza.errors import Cancelled, ConfigError
from plaza.metrics import (
    REASON_BACKEND,
    REASON_CANCELED,
    REASON_OTHER,
    REASON_REJECTED,
    MetricsServer,
    failure_reason,
)
from plaza.model_metrics import Buckets
from plaza.naming import (
    LABEL_MODEL,
    LABEL_OUTCOME,
    LABEL_PARTITION,
    LABEL_REASON,
    LABEL_TOPIC,
    LABEL_VERSION,
    METRIC_BATCH_SIZE,
    METRIC_COMPUTE_INFER_DURATION_US,
    METRIC_COMPUTE_INPUT_DURATION_US,
    METRIC_COMPUTE_OUTPUT_DURATION_US,
    METRIC_CONSUMER_LAG,
    METRIC_EXEC_COUNT,
    METRIC_FIRST_RESPONSE_HISTOGRAM,
    METRIC_INFERENCE_COUNT,
    METRIC_PENDING_REQUESTS,
    METRIC_QUEUE_DURATION_US,
    METRIC_REQUEST_DURATION_US,
    METRIC_REQUEST_FAILURE,
    METRIC_REQUEST_SUCCESS,
    METRIC_SEQUENCES_ACTIVE,
    METRIC_WORKER_RECORDS,
    Names,
)
from plaza.settings import WorkerSettings, parse_quantiles
from plaza.statistics import (
    MAX_UNCONFIRMED_FLUSHES,
    SEQUENCED_FLUSH_SCRIPT,
    FlushLog,
    ModelStatistics,
    flusher_key,
)
from plaza.workers.cpu_metrics import CpuCollector
from plaza.workers.custom_metrics import CustomMetrics, Source
from plaza.workers.gpu_metrics import GpuCollector
from plaza.workers.latency_summaries import SUMMARY_FAMILIES, LatencySummaries
from plaza.workers.response_statistics import (
    FIRST_RESPONSE_BUCKETS_MS,
    FirstResponses,
    ResponseTiming,
    count_response,
    is_first_response,
)
from plaza.workers.runner import WorkItem

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
"""Upper bounds of the batch-size histogram (rows per execution)."""
FAILURE_REASONS = (REASON_BACKEND, REASON_CANCELED, REASON_OTHER, REASON_REJECTED)
"""Triton's failure reasons: each served version has a failure series of each from the
start, at 0 until its first such failure, as in Triton."""
_NS_PER_US = 1000

Answer = tuple[InferResult, str | None]
_Versions = list[tuple[str, ModelStatistics]]

RECORD_OUTCOMES = (
    "fetched",
    "rejected",
    "expired",
    "dead_lettered",
    "written",
    "duplicate",
    "skipped",
)
"""What happens to a fetched record: rejected (an error answer at intake or by the queue
policy), expired (its deadline passed), dead_lettered, written (its answer stored),
duplicate (its answer was already stored when written: a replay, suppressed; no request
success or failure), skipped (its answer was already stored before it ran: cancelled by its
caller, then also a failure of reason CANCELED, or a replay; not run)."""


class WorkerMetrics:
    """Metrics and statistics of one worker (one model, the versions it serves)."""

    def __init__(
        self,
        model: str,
        names: Names,
        settings: WorkerSettings,
        *,
        stats_ttl_s: int,
        gpu: GpuCollector | None = None,
        hub: MetricsHub | None = None,
    ) -> None:
        self.model = model
        self._names = names
        self._settings = settings
        self._stats_ttl_s = stats_ttl_s
        self.stats: dict[str, ModelStatistics] = {}
        """Totals by version ("1", "2", ...); fixed once ``start`` has run."""
        self._flushes = FlushLog()
        self._flusher_key = flusher_key(names, model, self._flushes.flusher)
        self._default = ""
        self.lags: dict[Any, int] = {}
        """Consumer lag by TopicPartition, replaced by the scheduler on every decision."""
        self.records: dict[str, int] = dict.fromkeys(RECORD_OUTCOMES, 0)
        """Records by outcome (``RECORD_OUTCOMES``), since the worker started."""
        self.first_responses: dict[str, FirstResponses] | None = None
        """A decoupled model's first-response histogram by version (None: not decoupled)."""
        self._first_bounds: Buckets = FIRST_RESPONSE_BUCKETS_MS
        self.summaries: LatencySummaries | None = None
        """Triton's latency summaries (``worker.summary_latencies``; None: off)."""
        self._responses_lock = threading.Lock()  # responses come from every instance's thread
        self._pending: Callable[[], int] = lambda: 0
        self._sequences: Callable[[], int] | None = None
        self._custom: list[Source] = []
        self._own_hub = hub is None
        self.hub = hub if hub is not None else MetricsHub(settings, gpu=gpu)
        self.hub.join(self)
        self.gpu = self.hub.gpu
        self.registry = self.hub.registry

    @property
    def _server(self) -> MetricsServer | None:
        return self.hub.server

    @property
    def port(self) -> int | None:
        """Where /metrics is served (None before ``start`` or with ``metrics_port`` -1)."""
        return self.hub.port

    def start(
        self,
        versions: Sequence[int],
        pending: Callable[[], int],
        sequences: Callable[[], int] | None = None,
        *,
        decoupled: bool = False,
        first_response_buckets: Buckets = FIRST_RESPONSE_BUCKETS_MS,
        response_cache: bool = False,
    ) -> None:
        """Know the served versions, the pending count, (a stateful model's) the active
        sequences and whether the model is decoupled (its responses are counted one by
        one, its first ones in a histogram of ``first_response_buckets``, milliseconds)
        or caches its responses (no request summary then, as in Triton); serve /metrics
        unless it is off."""
        self.stats = {str(v): self.stats.get(str(v), ModelStatistics()) for v in versions}
        self._default = str(max(versions)) if versions else ""
        if not self.stats:
            self.stats[""] = ModelStatistics()
        if decoupled:
            self.first_responses = {
                v: FirstResponses(first_response_buckets) for v in self.stats if v
            }
            self._first_bounds = first_response_buckets
        if self._settings.summary_latencies:
            quantiles = parse_quantiles(self._settings.summary_quantiles)
            self.summaries = LatencySummaries(quantiles, request=not response_cache)
        self._pending = pending
        self._sequences = sequences
        self.hub.serve(self.model)

    def version(self, version: str) -> ModelStatistics:
        """The totals of ``version``; "" and versions not served count as the default."""
        stats = self.stats.get(version)
        if stats is None:
            stats = self.stats.get(self._default)
            if stats is None:
                stats = self.stats[self._default] = ModelStatistics()
        return stats

    def executions(self) -> int:
        """Backend executions so far, over every version."""
        return sum(s.execution_count for s in self.stats.values())

    def batch_sizes(self) -> dict[int, int]:
        """Executions by batch size (rows), over every version."""
        sizes: dict[int, int] = {}
        for stats in self.stats.values():
            for size, batch in stats.batches.items():
                sizes[size] = sizes.get(size, 0) + batch.compute_infer.count
        return sizes

    # -- feeding --------------------------------------------------------------------------
    def count(self, outcome: str, n: int = 1) -> None:
        """``n`` more records had ``outcome`` (one of ``RECORD_OUTCOMES``)."""
        self.records[outcome] += n

    def executed(self, items: Sequence[WorkItem], results: Sequence[InferResult]) -> None:
        """One backend execution that ran (the runner's observer; each half of a failed
        batch that ran again is one). An execution that answered no request successfully
        counts nothing."""
        ok = [r for r in results if r.error is None]
        if not ok:
            return
        rows = sum(it.rows for it, r in zip(items, results, strict=True) if r.error is None)
        stats = self.version(ok[0].version)
        stats.execution_count += 1
        stats.inference_count += rows
        batch = stats.batch(rows)
        # Each phase's longest: the execution's. A batch's requests share their input and
        # infer times; a decoupled batch's run until its last final response.
        for phase, duration in (
            ("compute_input", batch.compute_input),
            ("compute_infer", batch.compute_infer),
            ("compute_output", batch.compute_output),
        ):
            duration.add(max(r.timing_us.get(phase, 0) for r in ok) * _NS_PER_US)

    def answered(self, answers: Iterable[Answer]) -> None:
        """Answers now durable in Redis: success with its phases, or failure by reason.

        Sums per version first and adds once per batch: this runs for every request.
        """
        now_ms = int(time.time() * 1000)
        sums: dict[str, list[int]] = {}
        summaries = self.summaries
        for result, _ in answers:
            if result.error is not None:
                self._failed(result.version, result.error.code, now_ms)
                continue
            acc = sums.get(result.version)
            if acc is None:
                acc = sums[result.version] = [0, 0, 0, 0, 0]
            timing = result.timing_us
            queue = timing.get("queue", 0)
            c_in = timing.get("compute_input", 0)
            c_infer = timing.get("compute_infer", 0)
            c_out = timing.get("compute_output", 0)
            acc[0] += 1
            acc[1] += queue
            acc[2] += c_in
            acc[3] += c_infer
            acc[4] += c_out
            if summaries is not None:
                summaries.observe(result.version, queue, c_in, c_infer, c_out)
        for version, (n, queue, c_in, c_infer, c_out) in sums.items():
            stats = self.version(version)
            stats.last_inference = now_ms
            for phase, us in (
                (stats.success, queue + c_in + c_infer + c_out),
                (stats.queue, queue),
                (stats.compute_input, c_in),
                (stats.compute_infer, c_infer),
                (stats.compute_output, c_out),
            ):
                phase.count += n
                phase.ns += us * _NS_PER_US

    def cancelled(self, items: Sequence[WorkItem]) -> None:
        """Requests finished unrun because their callers cancelled them: failures of reason
        CANCELED, as Triton counts a request cancelled before it ran."""
        if not items:
            return
        now_ms = int(time.time() * 1000)
        for item in items:
            self._failed(str(item.version), Cancelled.code, now_ms)

    def responded(self, item: WorkItem, result: InferResult, timing: ResponseTiming) -> None:
        """One response of a decoupled model, as the model sent it (any thread)."""
        with self._responses_lock:
            count_response(self.version(result.version), result, timing)
            if is_first_response(result):
                self._first_response(result.version, timing.since_request_ns)

    def first_response(self, version: str, since_request_ns: int) -> None:
        """A decoupled request's first response, ``since_request_ns`` after its intake,
        without a count in ``response_stats`` (a decoupled ensemble's: Triton counts
        those only for backends)."""
        with self._responses_lock:
            self._first_response(version, since_request_ns)

    def _first_response(self, version: str, since_request_ns: int) -> None:
        first = self.first_responses
        if first is not None:
            histogram = first.get(version) or first.setdefault(
                self._default, FirstResponses(self._first_bounds)
            )
            histogram.observe(since_request_ns)

    def _failed(self, version: str, code: str, now_ms: int) -> None:
        stats = self.version(version)
        stats.last_inference = now_ms
        stats.fail.add(0)  # the worker does not time failures; Triton's ns stays 0
        reason = failure_reason(code)
        stats.failures[reason] = stats.failures.get(reason, 0) + 1

    # -- publishing -----------------------------------------------------------------------
    async def flush_with(self, pipe: Any) -> list[Any]:
        """Execute ``pipe`` (the heartbeat's) with the statistics changed since the last flush.

        One round trip for both. A flush whose reply does not come (an error, a cancel) is
        sent again with the next ones and applied once however often Redis ran it
        (``FlushLog``), so a beat that fails carries its changes over, and one cancelled
        after Redis ran it adds nothing twice.
        """
        flushes = self._flushes
        flushes.add(
            {
                self._names.model_stats_key(self.model, v): s.fields()
                for v, s in self.stats.items()
                if v
            }
        )
        carried = flushes.seq if flushes.unconfirmed else 0
        if carried:
            keys, args = flushes.arguments(self._flusher_key, self._stats_ttl_s)
            pipe.eval(SEQUENCED_FLUSH_SCRIPT, len(keys), *keys, *args)
        replies: list[Any] = await pipe.execute()
        flushes.confirmed(carried)
        return replies

    async def close(self, redis: aioredis.Redis) -> None:
        """Flush the last statistics (best effort), stop serving /metrics, release NVML."""
        try:
            # Twice when the first call only sends a full backlog of unconfirmed flushes.
            for _ in range(2):
                backlog = len(self._flushes.unconfirmed) >= MAX_UNCONFIRMED_FLUSHES
                await self.flush_with(redis.pipeline(transaction=False))
                if not backlog:
                    break
        except Exception as exc:
            log.warning("%s: last statistics flush failed: %s", self.model, exc)
        self.hub.leave(self)
        for source in self._custom:
            self.hub.custom.remove(source)
        if self._own_hub:
            self.hub.close()

    def watch(self, source: Source) -> None:
        """Serve the custom metrics of this model process (a Python model's) until close."""
        self._custom.append(source)
        self.hub.custom.add(source)


class MetricsHub:
    """One process's /metrics: the registry, its server, the GPU and CPU collectors and the
    Python models' own metrics, shared by the WorkerMetrics of every model the process
    serves."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        gpu: GpuCollector | None = None,
        cpu: CpuCollector | None = None,
    ) -> None:
        self._settings = settings
        self.members: list[WorkerMetrics] = []
        self.gpu = gpu if gpu is not None else GpuCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self.registry.register(self.gpu)
        self.registry.register(cpu if cpu is not None else CpuCollector())
        self.custom = CustomMetrics()
        """Python models' own metrics (``workers/custom_metrics.py``)."""
        self.registry.register(self.custom)
        self.server: MetricsServer | None = None
        self._failed = False

    @property
    def port(self) -> int | None:
        return self.server.port if self.server is not None else None

    def join(self, metrics: WorkerMetrics) -> None:
        self.members.append(metrics)

    def leave(self, metrics: WorkerMetrics) -> None:
        if metrics in self.members:
            self.members.remove(metrics)

    def serve(self, who: str) -> None:
        """Serve /metrics (once) unless ``metrics_port`` is -1 or the port was taken."""
        if self._settings.metrics_port < 0 or self.server is not None or self._failed:
            return
        try:
            self.server = MetricsServer(
                self.registry, self._settings.metrics_host, self._settings.metrics_port
            )
        except ConfigError as exc:  # a port taken: serve the models all the same
            self._failed = True
            log.error("%s: worker serves no metrics: %s", who, exc.message)
            return
        log.info("%s metrics at %s", who, self.server.url)

    def close(self) -> None:
        """Stop serving /metrics and release NVML (idempotent)."""
        if self.server is not None:
            self.server.close()
            self.server = None
        with contextlib.suppress(Exception):
            self.gpu.close()


def _labels(model: str, version: str) -> list[str]:
    return [model, version]


class _Collector:
    """Renders the numbers of a hub's WorkerMetrics as Prometheus families at scrape time:
    each family once, one sample per model (and version)."""

    def __init__(self, hub: MetricsHub) -> None:
        self._hub = hub

    def collect(self) -> Iterator[Metric]:
        # A reload's new unit joins before the old one leaves (workers/model_watch.py): the
        # newest member of a model speaks for it, so no series shows twice in a scrape (its
        # counters start again from zero, as a restarted worker's do).
        newest = {m.model: m for m in list(self._hub.members)}
        members = list(newest.values())
        served = [(m, [(v, s) for v, s in dict(m.stats).items() if v]) for m in members]
        yield from self._counters(served)
        yield self._failures(served)
        yield self._batch_sizes(served)
        yield self._first_responses(members)
        yield from self._summaries(members)
        pending = GaugeMetricFamily(
            METRIC_PENDING_REQUESTS,
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=[LABEL_MODEL, LABEL_VERSION],
        )
        for m, versions in served:
            # The batcher holds requests of every served version together.
            version = versions[0][0] if len(versions) == 1 else ""
            pending.add_metric(_labels(m.model, version), m._pending())
        yield pending
        active = GaugeMetricFamily(
            METRIC_SEQUENCES_ACTIVE,
            "Sequences of a stateful model this worker holds (started, not ended or released).",
            labels=[LABEL_MODEL],
        )
        for m in members:
            if m._sequences is not None:
                active.add_metric([m.model], m._sequences())
        yield active
        lag = GaugeMetricFamily(
            METRIC_CONSUMER_LAG,
            "Records in the partition not yet fetched by this worker (high-water mark - position).",
            labels=[LABEL_MODEL, LABEL_TOPIC, LABEL_PARTITION],
        )
        for m in members:
            for tp, value in dict(m.lags).items():
                lag.add_metric([m.model, str(tp.topic), str(tp.partition)], value)
        yield lag
        records = CounterMetricFamily(
            METRIC_WORKER_RECORDS,
            "Records this worker fetched, and what became of them",
            labels=[LABEL_MODEL, LABEL_OUTCOME],
        )
        for m in members:
            for outcome, count in dict(m.records).items():
                records.add_metric([m.model, outcome], count)
        yield records

    @staticmethod
    def _counters(served: list[tuple[WorkerMetrics, _Versions]]) -> Iterator[Metric]:
        specs: list[tuple[str, str, Callable[[ModelStatistics], int]]] = [
            (
                METRIC_REQUEST_SUCCESS,
                "Number of successful inference requests, all batch sizes",
                lambda s: s.success.count,
            ),
            (
                METRIC_INFERENCE_COUNT,
                "Number of inferences performed (a batch of n counts n)",
                lambda s: s.inference_count,
            ),
            (
                METRIC_EXEC_COUNT,
                "Number of model executions performed",
                lambda s: s.execution_count,
            ),
            (
                METRIC_REQUEST_DURATION_US,
                "Cumulative inference request duration in microseconds",
                lambda s: s.success.ns // _NS_PER_US,
            ),
            (
                METRIC_QUEUE_DURATION_US,
                "Cumulative inference queuing duration in microseconds",
                lambda s: s.queue.ns // _NS_PER_US,
            ),
            (
                METRIC_COMPUTE_INPUT_DURATION_US,
                "Cumulative compute input duration in microseconds",
                lambda s: s.compute_input.ns // _NS_PER_US,
            ),
            (
                METRIC_COMPUTE_INFER_DURATION_US,
                "Cumulative compute inference duration in microseconds",
                lambda s: s.compute_infer.ns // _NS_PER_US,
            ),
            (
                METRIC_COMPUTE_OUTPUT_DURATION_US,
                "Cumulative inference compute output duration in microseconds",
                lambda s: s.compute_output.ns // _NS_PER_US,
            ),
        ]
        for name, doc, read in specs:
            family = CounterMetricFamily(name, doc, labels=[LABEL_MODEL, LABEL_VERSION])
            for m, versions in served:
                for version, stats in versions:
                    family.add_metric(_labels(m.model, version), read(stats))
            yield family

    @staticmethod
    def _failures(served: list[tuple[WorkerMetrics, _Versions]]) -> Metric:
        family = CounterMetricFamily(
            METRIC_REQUEST_FAILURE,
            "Number of failed inference requests, all batch sizes",
            labels=[LABEL_MODEL, LABEL_VERSION, LABEL_REASON],
        )
        for m, versions in served:
            for version, stats in versions:
                failures = dict(stats.failures)
                for reason in sorted({*FAILURE_REASONS, *failures}):
                    family.add_metric([m.model, version, reason], failures.get(reason, 0))
        return family

    @staticmethod
    def _batch_sizes(served: list[tuple[WorkerMetrics, _Versions]]) -> Metric:
        family = HistogramMetricFamily(
            METRIC_BATCH_SIZE,
            "Rows per model execution (the batch sizes the dynamic batcher formed)",
            labels=[LABEL_MODEL, LABEL_VERSION],
        )
        for m, version, stats in ((m, v, s) for m, vs in served for v, s in vs):
            counts = {size: b.compute_infer.count for size, b in dict(stats.batches).items()}
            buckets = [
                (str(float(le)), sum(n for size, n in counts.items() if size <= le))
                for le in BATCH_BUCKETS
            ]
            buckets.append(("+Inf", sum(counts.values())))
            total = sum(size * n for size, n in counts.items())
            family.add_metric(_labels(m.model, version), buckets, total)
        return family

    @staticmethod
    def _summaries(members: list[WorkerMetrics]) -> Iterator[Metric]:
        """Triton's latency summaries, for the models that keep them."""
        kept = [(m, m.summaries) for m in members if m.summaries is not None]
        if not kept:
            return
        for phase, (name, doc) in SUMMARY_FAMILIES.items():
            family = Metric(name, doc, "summary")
            for m, summaries in kept:
                quantiles = [str(q) for q, _ in summaries.quantiles]
                for version, values, count, total in summaries.read(phase):
                    labels = {LABEL_MODEL: m.model, LABEL_VERSION: version}
                    for quantile, value in zip(quantiles, values, strict=True):
                        family.add_sample(name, {**labels, "quantile": quantile}, value)
                    family.add_sample(f"{name}_count", labels, count)
                    family.add_sample(f"{name}_sum", labels, total)
            if family.samples:  # the request's: none where every model caches responses
                yield family

    @staticmethod
    def _first_responses(members: list[WorkerMetrics]) -> Metric:
        """Triton's first-response histogram: decoupled models only, as in Triton."""
        family = HistogramMetricFamily(
            METRIC_FIRST_RESPONSE_HISTOGRAM,
            "Duration from request to first response in milliseconds",
            labels=[LABEL_MODEL, LABEL_VERSION],
        )
        for m in members:
            for version, histogram in sorted(dict(m.first_responses or {}).items()):
                family.add_metric(
                    _labels(m.model, version), histogram.cumulative(), histogram.sum_ms
                )
        return family


METRIC_HOST_LOADS = "plaza_host_model_loads"
METRIC_HOST_UNLOADS = "plaza_host_model_unloads"
METRIC_HOST_EVICTIONS = "plaza_host_model_evictions"
METRIC_HOST_MEMORY = "plaza_host_memory_bytes"
METRIC_HOST_MEMORY_BUDGET = "plaza_host_memory_budget_bytes"


class HostMetrics:
    """A host's model lifecycle counters and memory gauges (``workers/model_watch.py``),
    a collector on the host's /metrics registry (``MetricsHub.registry``)."""

    def __init__(self, budget_bytes: int = 0) -> None:
        self.loads: dict[str, int] = {}
        self.unloads: dict[str, int] = {}
        self.evictions: dict[str, int] = {}
        self.memory_bytes = 0
        self.budget_bytes = budget_bytes

    @staticmethod
    def count(counts: dict[str, int], model: str) -> None:
        counts[model] = counts.get(model, 0) + 1

    def collect(self) -> Iterator[Metric]:
        for name, doc, counts in (
            (METRIC_HOST_LOADS, "Models loaded on this host.", self.loads),
            (
                METRIC_HOST_UNLOADS,
                "Models unloaded (drained and stopped) on this host.",
                self.unloads,
            ),
            (
                METRIC_HOST_EVICTIONS,
                "Idle models unloaded to fit the memory budget.",
                self.evictions,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=[LABEL_MODEL])
            for model, n in sorted(dict(counts).items()):
                family.add_metric([model], n)
            yield family
        yield GaugeMetricFamily(
            METRIC_HOST_MEMORY,
            "Bytes accounted to the models loaded on this host.",
            value=self.memory_bytes,
        )
        yield GaugeMetricFamily(
            METRIC_HOST_MEMORY_BUDGET,
            "The host's memory budget in bytes (0: none).",
            value=self.budget_bytes,
        )
