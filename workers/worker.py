"""The worker: one model, one consumer-group member, five cooperating tasks.

A worker runs alone in its process or as one of the models of a host
(``plaza.workers.host``), sharing the device, its scheduler, /metrics, Redis and the
dead-letter producer (``HostServices``); either way every batch asks the device scheduler
for a grant (one of the model's ``instance_group`` instances, an execution slot, the rate
limiter's resources) before it runs, so up to instance-count batches run at once.

- intake: fetches records (bounded by ``max_pending`` records and ``max_pending_bytes``, and
  a priority level's topic by its ``max_queue_size``: records wait in Kafka, never refused),
  counts their deliveries and finds those already answered (one Redis round trip per fetch;
  those are finished unrun), admits them into the batcher, answers invalid ones at once and
  dead-letters unreadable ones and poison records (delivered ``max_deliveries`` times
  without an answer: each worker that took them died);
- scheduler: runs suspects (records a worker that stopped had begun to run, maybe the reason
  it died: each batch marks its records running as it starts) alone,
  one per batch, so only the culprit of a crash keeps failing; otherwise, once one of the
  model's instances is free (as Triton's batcher: while all are busy the requests stay
  queued, where their queue timeouts apply and later ones join them), asks the batcher for
  the next batch (depth = pending + consumer lag), waits for a grant and runs it on the
  granted instance's executor thread (a task per execution), so fetching, writing and the
  next batch go on while the model computes;
- writer: writes each batch's results to Redis in one round trip, then tells the committer;
- committer: commits the offsets that became safe (only after the results are durable), one
  commit at a time, so the writer does not wait for Kafka and the batches written during a
  commit share the next one;
- heartbeat: keeps this worker in the model's registry, which the gateway's readiness reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition

from plaza.batching import Batcher, BatchingPolicy, DynamicBatcher, queue_deadline
from plaza.connections import ensure_topics, kafka_consumer, redis_answers
from plaza.contract import InferResult
from plaza.due_timer import DueTimer
from plaza.errors import (
    ConfigError,
    DeadlineExceeded,
    InvalidInput,
    PlazaError,
    PoisonRecord,
    QueueFull,
)
from plaza.log_settings import LogFollower, LogSettings
from plaza.model_control import model_spec
from plaza.model_metrics import warn_unknown_families
from plaza.modelconfig import BACKEND_PYTHON, ModelSpec
from plaza.repository import ModelRepository
from plaza.retry import FIRST_DELAY_S, MAX_DELAY_S, until_done
from plaza.sequence_batching import SequenceKey
from plaza.settings import PlazaSettings
from plaza.tasks import cancel_and_wait
from plaza.workers import classification, warmup
from plaza.workers.admission import DeadLetter, Rejected, admit, monotonic_deadline, wait_began
from plaza.workers.answered import RECHECK_AFTER_S, AnsweredCheck
from plaza.workers.backends import Backend, create_backend
from plaza.workers.backends.base import CancellableBackend, hears_cancels
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.commit import Rebalance, commit_owned
from plaza.workers.dead_letter import dead_letter
from plaza.workers.deliveries import DeliveryCounter
from plaza.workers.device import check_instance_gpus
from plaza.workers.device_scheduler import Grant, instance_specs
from plaza.workers.host_services import HostServices
from plaza.workers.metrics import WorkerMetrics
from plaza.workers.offsets import OffsetTracker, follow_positions, read_ahead
from plaza.workers.responses import ResponseBuffer
from plaza.workers.runner import BatchRunner, ResponseSink, WorkItem, error_result
from plaza.workers.sequences import SequenceRuns, initial_states, read_states
from plaza.workers.writer import ResultWriter, StateWrite

log = logging.getLogger(__name__)
Answer = tuple[InferResult, str | None]
Fetched = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]
CANCEL_CHECK_S = 0.1
"""How often a Python model's worker looks whether its running requests' callers went away
(one pipelined Redis call, only while such requests run)."""
RecordKey = tuple[TopicPartition, int]
Record: TypeAlias = ConsumerRecord[Any, Any]
Deferred = tuple[WorkItem, int, Record, float | None, float | None]
"""A request that waits for its sequence's state: ``_queue``'s arguments but ``done``."""


@dataclass(frozen=True, slots=True)
class KafkaClients:
    """The worker's Kafka clients, made in ``Worker.start`` (they need the running loop)."""

    producer: AIOKafkaProducer
    """The host's (shared by its workers: dead letters only)."""
    consumer: AIOKafkaConsumer


@dataclass(frozen=True, slots=True)
class Suspect:
    """A record that a worker which stopped had begun to run: it runs alone, and is judged."""

    item: WorkItem
    record: Record
    expires: float | None = None
    """When it is answered with a timeout error instead of run (a monotonic time), as the
    batcher would answer it: None if never (no deadline, or a queue policy that DELAYs)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A record taken in and not yet finished: what it costs and how often it came."""

    nbytes: int
    deliveries: int


def _record_id(record: Record) -> str | None:
    """The request id a record's key names (the producer core keys records by id), or
    None: no key, or one that is not text (then the launch-time look covers it)."""
    key = record.key
    if not key:
        return None
    try:
        return bytes(key).decode()
    except UnicodeDecodeError:
        return None


def _within(limit: int, rooms: dict[str, int | None] | None, tps: list[TopicPartition]) -> int:
    """``limit``, lowered to the room of the fullest of ``tps``' topics (``rooms``)."""
    bounds = [rooms[tp.topic] for tp in tps] if rooms is not None else []
    return min([limit, *(b for b in bounds if b is not None)])


@dataclass(slots=True)
class Completed:
    """Answers ready to write, and the records they finish."""

    answers: list[Answer] = field(default_factory=list)
    records: list[tuple[TopicPartition, int]] = field(default_factory=list)
    in_flight: int = 0
    """How many of them the scheduler counted as in flight."""
    states: list[StateWrite] = field(default_factory=list)
    """A stateful model's sequences' states, written with their answers."""
    skipped: list[WorkItem] = field(default_factory=list)
    """Requests found answered already (finished unrun): their stored answers go to their
    reply streams again first (``_resend``); intake's are counted once it has looked which
    of them their callers cancelled (``_count_skipped``)."""


class Worker:
    """Serves one model from its Kafka topic(s) until stopped.

    ``services``: the host's shared ones; without, the worker makes its own (a host of one).
    """

    def __init__(
        self,
        settings: PlazaSettings,
        services: HostServices | None = None,
        *,
        device_key: str | None = None,
    ) -> None:
        if not settings.worker.model:
            raise ConfigError("worker.model is required (--worker.model NAME)")
        self.settings = settings
        self.model = settings.worker.model
        self.names = settings.names
        self.id = settings.worker.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self._owns_services = services is None
        self.services = services if services is not None else HostServices.create(settings)
        self.metrics = WorkerMetrics(
            self.model,
            self.names,
            settings.worker,
            stats_ttl_s=settings.redis.stats_ttl_s,
            hub=self.services.metrics,
        )
        self.offsets = OffsetTracker()
        self._fetched: dict[TopicPartition, int] = {}
        self._held: dict[RecordKey, Held] = {}
        self.pending_bytes = 0
        """Bytes of the records held (taken in, not yet answered and written)."""
        self.peak_pending_bytes = 0
        self._record_bytes = 0.0
        """Running mean record size: how many records the byte budget has room for."""
        self._suspects: deque[Suspect] = deque()
        self._deferred: list[Deferred] = []
        """This fetch's requests of sequences not held here, waiting for their states."""
        self._deferred_keys: dict[SequenceKey, tuple[WorkItem, float]] = {}
        """Those sequences, each with its first request and when that was sent."""
        self._moved: set[TopicPartition] = set()
        """Partitions revoked since the last fetch returned: the rest of that fetch is not
        ours (a new assignment fetches again from the committed offset)."""
        self._in_flight = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._failed: asyncio.Future[None] | None = None
        """Fails with the exception of an execution task that raised (a bug: stop)."""
        self._executions: set[asyncio.Task[None]] = set()
        """Batches running now (at most the instance count)."""
        # The task's signals: stop asked, records arrived, room to fetch, nothing running.
        self._stopping = asyncio.Event()
        self._arrived = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._results: asyncio.Queue[Completed] = asyncio.Queue(maxsize=4)
        self._responses: ResponseSink | None = None
        """A decoupled model's responses' way to the writer (made in ``start``)."""
        self._response_buffer: ResponseBuffer | None = None
        self._cancels: asyncio.Task[None] | None = None
        """A Python model's cancel look (``_cancel_loop``); none for other models."""
        self._writes_closed = False
        """The writer is going away: a response still waiting for room gives up."""
        self._commit_due = asyncio.Event()
        """Records became durable: the committer commits what became safe."""
        self._commit_lock = asyncio.Lock()
        """One offset commit at a time (the committer's, a revocation's, the stop's)."""
        # The model (its backends load in ``start``) and how its requests are batched.
        self._repo = ModelRepository.of(settings)
        config = settings.worker.model_config_json  # a load request's override, if any
        self.spec: ModelSpec = model_spec(self._repo, self.model, config)
        self.versions = [mv.version for mv in self._repo.served_versions(self.model, self.spec)]
        # One runner per instance (instance_group count), each with its own copy of the
        # model's backends and its own executor thread, as Triton's model instances.
        self._executors = [
            ThreadPoolExecutor(1, thread_name_prefix=f"infer-{self.model}-{i}")
            for i in range(self.spec.instance_count)
        ]
        labels = classification.labels(self.spec, self._repo.root / self.model)
        responded = self.metrics.responded if self.spec.decoupled else None
        self.instances = [
            BatchRunner(
                self.spec,
                {},
                ex,
                self.id,
                observer=self.metrics.executed,
                labels=labels,
                response_observer=responded,
            )
            for ex in self._executors
        ]
        self.runner = self.instances[0]
        cap = self.spec.max_concurrency
        count = self.spec.instance_count
        self._instance_free = asyncio.Semaphore(min(count, cap) if cap > 0 else count)
        """The instances (up to ``max_concurrency``) not running a batch: the scheduler takes
        one before it asks the batcher for a batch, the batch's execution gives it back."""
        self._backends: dict[int, Backend] = self.runner.backends
        self.policy = BatchingPolicy.from_spec(self.spec)
        # A stateful model's sequences (sequence_batching) have a batcher of their own.
        keep_s = settings.redis.result_ttl_s
        model_dir = self._repo.root / self.model
        enabled = self.spec.sequence.enabled
        self.sequences = (
            SequenceRuns(
                self.spec,
                self.names,
                keep_s,
                initial_states(self.spec, model_dir),
                answer_states=settings.redis.cluster,
            )
            if enabled
            else None
        )
        self.batcher: Batcher[WorkItem] = (
            self.sequences.batcher
            if self.sequences is not None
            else DynamicBatcher(self.policy, bounded=False)  # intake bounds it (_topic_rooms)
        )
        self._max_wait_s = self.policy.max_queue_delay_us / 1e6
        self.topics = [self.names.request_topic(self.model, lv) for lv in self.policy.levels]
        self.device = self.services.scheduler
        self.device_key = device_key or self.model
        """Its name in the host's device scheduler: the model's, or (a reload's worker
        started beside the one serving, ``workers/model_watch.py``) one of its own."""
        check_instance_gpus(self.spec.name, self.spec.instance_groups, self.services.device)
        self.device.add_model(
            self.device_key,
            instance_specs(self.spec.instance_groups),
            self.spec.max_concurrency,
            # a Python model's own processes, which may wait on BLS calls to the host's
            # other models: no device slot (workers/device_scheduler.py)
            device_slot=self.spec.platform != BACKEND_PYTHON,
        )
        # Redis clients connect on first use; Kafka's need the running loop (``start``).
        self.redis = self.services.redis
        self.writer = ResultWriter(self.redis, settings.redis, self.names)
        self.answered = AnsweredCheck(self.redis, self.names)
        ttl_s = min(settings.worker.delivery_ttl_s, settings.redis.result_ttl_s)
        self.deliveries = DeliveryCounter(self.redis, self.names, ttl_s)
        self._kafka: KafkaClients | None = None
        self.log_settings = LogFollower(LogSettings.from_level(settings.log_level))
        """Triton's logging extension: the deployment's settings, followed on each beat."""
        self._levels: dict[str, int] = {}
        self._max_request_bytes = settings.kafka.max_request_bytes

    @property
    def producer(self) -> AIOKafkaProducer:
        """The dead-letter producer (once started)."""
        return self._started().producer

    @property
    def consumer(self) -> AIOKafkaConsumer:
        """The consumer-group member (once started)."""
        return self._started().consumer

    def _started(self) -> KafkaClients:
        if self._kafka is None:
            raise RuntimeError(f"worker {self.id} is not started")
        return self._kafka

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model, create topics, join the group; returns once serving. A start
        that fails gives back what it took (stop() will not run): the consumer leaves the
        group, the model is unloaded, the metrics leave the process's /metrics."""
        try:
            await self._start()
        except BaseException:
            await self._release_failed_start()
            raise

    async def _release_failed_start(self) -> None:
        if self._kafka is not None:
            with contextlib.suppress(Exception):
                await self.consumer.stop()  # a member that never fetches would hold partitions
        with contextlib.suppress(Exception):
            await self.metrics.close(self.redis)
        for close in (self.writer.close, self.deliveries.close):
            with contextlib.suppress(Exception):
                await close()
        self.device.remove_model(self.device_key)
        if self._owns_services:
            with contextlib.suppress(Exception):
                await self.services.close()
        await self._unload_backends()

    async def _unload_backends(self) -> None:
        """Unload every instance's backends and shut their executors (at stop, or after a
        failed load or start: nothing stays loaded). The unloads run at once, each on a
        thread of its own, never on the loop: a Python model's may wait seconds for its
        processes, while the host's other models go on serving. One that fails is logged
        and the others unload all the same; a cancelled stop leaves them running."""
        loaded = [(v, b) for runner in self.instances for v, b in runner.backends.items()]
        for runner in self.instances:
            runner.backends.clear()
        try:
            unloads = [asyncio.to_thread(backend.unload) for _, backend in loaded]
            outcomes = await asyncio.shield(asyncio.gather(*unloads, return_exceptions=True))
            for (version, _), outcome in zip(loaded, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    why = f"{self.id}: unloading version {version} failed: {outcome!r}"
                    log.error("%s", why, exc_info=outcome)
        finally:
            for executor in self._executors:
                executor.shutdown(wait=False)

    async def _start(self) -> None:
        ws = self.settings.worker
        # Before it loads a model or takes partitions: a worker whose Redis refuses it (a
        # wrong password) or does not answer would take requests and never answer one.
        await redis_answers(self.redis, self.settings.redis)
        await self._load_backends(self._repo)
        await ensure_topics(
            self.settings.kafka, [*self.topics, self.names.dead_letter_topic(self.model)]
        )
        await self.services.start()
        self._failed = asyncio.get_running_loop().create_future()
        self._responses = self._response_sink()
        self._kafka = KafkaClients(self.services.producer, await self._make_consumer())
        self.consumer.subscribe(self.topics, listener=Rebalance(self))
        await self.consumer.start()
        seq = self.sequences
        active = None if seq is None else (lambda: seq.batcher.active)
        self.metrics.start(
            self.versions,
            pending=self._pending,
            sequences=active,
            decoupled=self.spec.decoupled,
            first_response_buckets=self.spec.first_response_buckets_ms,
            response_cache=self.spec.response_cache,
        )
        warn_unknown_families(self.spec.config)
        await self._beat()
        spawn = asyncio.create_task
        self._tasks = [
            spawn(self._intake_loop(), name="intake"),
            spawn(self._schedule_loop(), name="scheduler"),
            spawn(self._write_loop(), name="writer"),
            spawn(self._heartbeat_loop(), name="heartbeat"),
            spawn(self._commit_loop(), name="committer"),
        ]
        cancellable = [b for r in self.instances for b in r.backends.values() if hears_cancels(b)]
        if cancellable:
            self._cancels = spawn(self._cancel_loop(cancellable), name="cancels")
        log.info(
            "worker %s serving %s versions %s from %s (max_pending %d, %d bytes)",
            self.id,
            self.model,
            self.versions,
            self.topics,
            ws.max_pending,
            ws.max_pending_bytes,
        )

    async def _make_consumer(self) -> AIOKafkaConsumer:
        """The group member, its read-ahead a quarter of the byte budget over every
        partition of the level topics (``read_ahead``)."""
        kafka = self.settings.kafka
        budget = self.settings.worker.max_pending_bytes
        limits = await read_ahead(self.services.producer, self.topics, kafka, budget, self.id)
        return kafka_consumer(kafka, self.names.consumer_group(self.model), **limits)

    def _pending(self) -> int:
        """Requests held: waiting in the batcher, waiting as suspects, or running."""
        return len(self.batcher) + len(self._suspects) + self._in_flight

    async def _load_backends(self, repo: ModelRepository) -> None:
        """Load every instance's backend of every served version, then run the model's
        warmup samples on each (``workers/warmup.py``)."""
        device = self.services.device
        loop = asyncio.get_running_loop()
        samples = warmup.samples(self.spec, repo.root / self.model)
        try:
            pairs = zip(self.instances, self._executors, strict=True)
            for number, (runner, executor) in enumerate(pairs):
                for mv in repo.served_versions(self.model, self.spec):
                    backend = create_backend(
                        mv, device, self.settings.worker.intra_op_threads, settings=self.settings
                    )
                    if isinstance(backend, PythonBackend):
                        backend.instance = number  # its name in initialize's args
                    await loop.run_in_executor(executor, backend.load)
                    runner.backends[mv.version] = backend
                    if isinstance(backend, PythonBackend):
                        self.metrics.watch(backend)  # model.py's own metrics
                    if samples:
                        alone = None if self.sequences is None else self.sequences.alone
                        await loop.run_in_executor(
                            executor, warmup.run, runner, mv.version, samples, alone
                        )
        except BaseException:  # a failed load or warmup: nothing stays loaded (stop() won't run)
            await self._unload_backends()
            raise

    async def run_until_stopped(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set or a task fails (then re-raise after stopping)."""
        waiter = asyncio.create_task(stop.wait())
        watched: list[asyncio.Future[Any]] = [waiter, *self._tasks]
        if self._failed is not None:
            watched.append(self._failed)
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        failed = [t.exception() for t in done if t is not waiter and t.exception() is not None]
        await self.stop()
        if failed:
            raise failed[0]  # type: ignore[misc]

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop fetching, finish what is pending, commit, leave the group."""
        if not self._tasks:
            return
        self._stopping.set()
        intake, scheduler, writer, heartbeat, committer = self._tasks
        intake.cancel()
        self._arrived.set()
        await asyncio.wait({scheduler}, timeout=drain_timeout_s)  # it ends once drained
        if self._executions:
            await asyncio.wait(set(self._executions), timeout=drain_timeout_s)
        log.debug("%s: stop: scheduler done=%s", self.id, scheduler.done())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._results.join(), drain_timeout_s)
        log.debug("%s: stop: results written", self.id)
        await self._commit()
        log.debug("%s: stop: committed", self.id)
        # The records left (a suspect not run, an execution past the drain timeout) go to
        # the next owner, a first delivery's counter released; the finished records'
        # counters go too. (The consumer's revocation below finds the tasks gone.)
        with contextlib.suppress(Exception):  # Redis away: the counters expire by their ttl
            await self._hand_back(set(self.consumer.assignment()))
        # An execution still running after the drain timeout goes too.
        self._writes_closed = True
        watch = [self._cancels] if self._cancels is not None else []
        await cancel_and_wait(
            [writer, heartbeat, committer, scheduler, intake, *watch, *self._executions]
        )
        self._cancels = None
        self._tasks = []
        await self.metrics.close(self.redis)  # the last statistics flush; /metrics goes away
        with contextlib.suppress(Exception):
            await self.redis.zrem(self.names.worker_registry_key(self.model), self.id)
        await self.consumer.stop()
        await self.writer.close()
        await self.deliveries.close()
        self.device.remove_model(self.device_key)
        if self._owns_services:
            await self.services.close()
        await self._unload_backends()  # the executions are over or given up (above)
        log.info("worker %s stopped", self.id)

    # -- intake ----------------------------------------------------------------------------
    async def _intake_loop(self) -> None:
        while True:
            room = self._room()
            if room <= 0 or self._levels_full():
                self._space.clear()
                await self._space.wait()
                continue
            fetched = await self._fetch(room)
            # What getmany returned belongs to the assignment of this moment (a rebalance
            # during the fetch reset the positions); only a revocation from now on, while
            # the fetch is taken in, leaves the rest of it to the partition's next fetch.
            self._moved.clear()
            await self._take_all(fetched)
            await self._note_positions()

    def _room(self) -> int:
        """Records to fetch now: what both ``max_pending`` and ``max_pending_bytes`` allow.

        The byte room is estimated from the mean record size (one record, to learn it, on
        the first fetch), so a fetch overshoots the budget by one record plus the spread of
        sizes at most; one record is always allowed when nothing is held, so a record
        bigger than the budget cannot stall the partition.
        """
        ws = self.settings.worker
        by_count = ws.max_pending - self._pending()
        free = ws.max_pending_bytes - self.pending_bytes
        if free <= 0:
            return 0 if self._held else 1
        if not self._record_bytes:
            return min(by_count, 1)
        return min(by_count, max(1, int(free // self._record_bytes)))

    async def _take_all(self, fetched: Fetched) -> None:
        # One clock reading for the whole fetch: its records arrived together, before the
        # delivery count's round trip (which the batcher's wait then overlaps).
        now_mono, now_wall = time.monotonic(), time.time()
        records = [(tp, r) for tp, rs in fetched.items() for r in rs]
        ids = [_record_id(r) for _, r in records]
        counted = await self.deliveries.take(
            [(tp.topic, tp.partition, r.offset) for tp, r in records],
            [None if rid is None else self.names.result_key(rid) for rid in ids],
        )
        # A record counts as delivered before only where an earlier delivery ran it (a
        # suspect); one a stopped worker merely fetched is batched as a first delivery.
        counts, answered = counted.suspects(), counted.answered
        done = Completed()
        for (tp, record), deliveries, rid, hit in zip(records, counts, ids, answered, strict=True):
            looked_id = None if hit is None else rid
            await self._take(tp, record, deliveries, done, now_mono, now_wall, looked_id, hit)
        if self._deferred:
            await self._resume(done)
        if done.records:
            await self._results.put(done)
        self._arrived.set()
        if done.skipped:
            await self._count_skipped(done.skipped)

    async def _count_skipped(self, skipped: list[WorkItem]) -> None:
        """Count requests intake found answered: each a record skipped, and those their
        callers cancelled failures of reason CANCELED (a replay counted when first run)."""
        cancelled = await self.answered.cancelled(skipped)
        self.metrics.count("skipped", len(skipped))
        self.metrics.cancelled(cancelled)

    async def _note_positions(self) -> None:
        """After a fetch is taken in entirely: each owned partition's position bounds the
        commit once its records are done, and the lag (``follow_positions``); not those being
        revoked (``_moved``), whose refused records the next owner must run."""
        if await follow_positions(self.consumer, self.offsets, self._fetched, self._moved):
            self._commit_due.set()

    async def _fetch(self, room: int) -> Fetched:
        """Records to take in, highest priority level first: the fetcher buffers every
        partition, and lower levels are read only when the higher ones have nothing. A
        topic whose records' level is full (max_queue_size) is not read: its records stay
        in Kafka until the level has room, and no more are read than it has room for."""
        limit = min(room, self.settings.worker.fetch_max_records)
        rooms = self._topic_rooms()
        if len(self.topics) > 1 or rooms is not None:
            levels: dict[int, list[TopicPartition]] = {}
            for tp in self.consumer.assignment():
                if rooms is None or rooms[tp.topic] != 0:
                    levels.setdefault(max(1, self._topic_level(tp.topic)), []).append(tp)
            for level in sorted(levels):
                tps = levels[level]
                got: Fetched = await self.consumer.getmany(
                    *tps, timeout_ms=0, max_records=_within(limit, rooms, tps)
                )
                if got:
                    return got
            if rooms is not None and self.consumer.assignment():
                open_tps = [tp for tps in levels.values() for tp in tps]
                if not open_tps:  # every level full: intake waits for room (_levels_full)
                    return {}
                some: Fetched = await self.consumer.getmany(
                    *open_tps, timeout_ms=200, max_records=_within(limit, rooms, open_tps)
                )
                return some
        waited: Fetched = await self.consumer.getmany(timeout_ms=200, max_records=limit)
        return waited

    def _topic_rooms(self) -> dict[str, int | None] | None:
        """For each request topic, how many records the batcher takes before a level they
        run at holds its max_queue_size (None: no bound); None when no level has one."""
        batcher = self.batcher
        if not isinstance(batcher, DynamicBatcher) or not any(
            self.policy.queue_policy(lv).max_queue_size for lv in self.policy.levels
        ):
            return None
        rooms: dict[str, int | None] = {}
        for topic in self.topics:
            level = self._topic_level(topic)
            # the base topic's records run at level 1 (the producer's), or at the default
            # level (a producer that names no priority); a .pN topic's at level N
            fed = {self.policy.level_of(level), self.policy.level_of(level or 1)}
            bounded = [r for r in map(batcher.level_room, fed) if r is not None]
            rooms[topic] = min(bounded) if bounded else None
        return rooms

    def _levels_full(self) -> bool:
        """Whether every level the assigned topics feed is full: nothing to fetch now."""
        rooms = self._topic_rooms()
        if rooms is None:
            return False
        assigned = {tp.topic for tp in self.consumer.assignment()}
        return bool(assigned) and all(rooms[topic] == 0 for topic in assigned)

    async def _take(
        self,
        tp: TopicPartition,
        record: Record,
        deliveries: int,
        done: Completed,
        now_mono: float | None = None,
        now_wall: float | None = None,
        looked_id: str | None = None,
        answered: bool | None = None,
    ) -> None:
        """Take one record in. ``looked_id``: the request id intake looked up by the record's
        key (None: not looked up), and ``answered`` whether that id had an answer."""
        if tp in self._moved or not self.offsets.started(tp, record.offset):
            # revoked while this fetch was being taken in: the next owner replays it, as a
            # first delivery where this one was (its counter, counted at intake, released)
            if deliveries <= 1:
                self.deliveries.finished([(tp.topic, tp.partition, record.offset)])
            return
        self.metrics.records["fetched"] += 1
        self._fetched[tp] = record.offset + 1
        self._hold((tp, record.offset), len(record.value or b""), deliveries)
        if now_mono is None:
            now_mono = time.monotonic()
        verdict = admit(
            record.value,
            self.spec,
            self.versions,
            max_bytes=self._max_request_bytes,
            names=self.names,
            worker_id=self.id,
            now=now_mono,
            partition=tp,
            offset=record.offset,
        )
        if type(verdict) is WorkItem:
            if looked_id is not None and looked_id == verdict.request.id:
                if answered:  # cancelled by its caller, or a replay: finish it unrun
                    if self.sequences is not None:
                        if await self._answered_start(verdict, deliveries, record, done):
                            return  # it keeps its place in its sequence, let go at launch
                        self.sequences.skipped(verdict)
                    done.skipped.append(verdict)
                    done.records.append((tp, record.offset))
                    return
                verdict.looked_at = now_mono
            self._queue(verdict, deliveries, record, done, now_mono, now_wall)
        elif isinstance(verdict, DeadLetter):
            await self._dead_letter(tp, record, verdict.error)
            self._finish([(tp, record.offset)])
        elif isinstance(verdict, Rejected):
            self.metrics.count("rejected")
            done.answers.append((verdict.result, verdict.reply_stream))
            done.records.append((tp, record.offset))
        else:
            self._queue(verdict, deliveries, record, done, now_mono, now_wall)

    def _queue(
        self,
        item: WorkItem,
        deliveries: int,
        record: Record,
        done: Completed,
        now_mono: float | None = None,
        now_wall: float | None = None,
        *,
        defer: bool = True,
    ) -> None:
        """Into the batcher, or, if delivered before, to the suspects that run alone; a
        sequence's request that needs its sequence's state first, to ``_resume``."""
        if self.sequences is not None and defer and self._defer(item, record):
            self._deferred.append((item, deliveries, record, now_mono, now_wall))
            return
        req, tp = item.request, item.partition
        if now_mono is None:
            now_mono = time.monotonic()
        if now_wall is None:
            now_wall = time.time()
        deadline = None
        if req.deadline_ms is not None:
            deadline = monotonic_deadline(req, now_mono, now_wall)
        if deliveries > 1:
            try:
                expires = self._suspect_expiry(item, deadline, now_mono)
            except PlazaError as exc:  # answered, not left to kill the intake (and the next)
                self._refuse(item, exc, done)
                return
            self._suspects.append(Suspect(item, record, expires))
            return
        began = now_mono
        if self.settings.worker.queue_delay_from == "sent":
            began = wait_began(req, now_mono, now_wall, self._max_wait_s)
        try:
            self.batcher.add(
                item,
                size=item.rows,
                priority=req.priority or self._topic_level(tp.topic),
                deadline=deadline,
                arrival=began,
            )
        except (QueueFull, InvalidInput) as exc:  # max_sequences held, a negative priority
            self._refuse(item, exc, done)

    def _refuse(self, item: WorkItem, exc: PlazaError, done: Completed) -> None:
        """Answer ``item`` with ``exc`` instead of queueing it; its record is finished (a
        START refused drops the state of the sequence before it, as one that expired)."""
        self.metrics.count("rejected")
        req = item.request
        done.answers.append((error_result(req, exc, worker=self.id), req.reply.stream))
        done.records.append((item.partition, item.offset))
        if self.sequences is not None:
            done.states += self.sequences.unrun_starts([item], len(done.answers) - 1)

    def _suspect_expiry(self, item: WorkItem, deadline: float | None, now: float) -> float | None:
        """When a suspect (which skips the batcher) expires as the batcher would judge it:
        ``plaza.batching.queue_deadline`` (the level's queue-policy timeout counted from
        ``now``, which its deadline shortens only with ``allow_timeout_override``; a
        deadline already passed), never where the level DELAYs expired requests. The
        sequence batcher expires a request by its own deadline alone."""
        if self.sequences is not None:
            return deadline
        level = self.policy.level_of(
            item.request.priority or self._topic_level(item.partition.topic)
        )
        qp = self.policy.queue_policy(level)
        if not qp.reject_on_timeout:
            return None
        return queue_deadline(qp, deadline, now)

    async def _answered_start(
        self, item: WorkItem, deliveries: int, record: Record, done: Completed
    ) -> bool:
        """Whether ``item``, found answered at intake, is a START queued all the same: its
        sequence is held here, or a request before it in this fetch waits for its state. It
        never runs (``placeholder``): at launch it is let go (``_unanswered``) once the
        requests before it ran, which unstarts the sequence and drops the state they left
        in Redis, as for a START cancelled in the queue. Any other START drops that state
        now, before a request after it in this fetch reads it (``_resume``)."""
        seq = self.sequences
        assert seq is not None
        key = seq.start_of(item)
        if key is None:
            return False
        if seq.batcher.holds(key) or key in self._deferred_keys:
            self._queue(seq.placeholder(item), deliveries, record, done)
            return True
        await seq.drop_before_starts(self.redis, [item])
        return False

    def _defer(self, item: WorkItem, record: Record) -> bool:
        """Whether ``item`` waits for its sequence's state: the sequence is not held here
        and ``item`` does not start it, or a request before it in this fetch waits."""
        seq = self.sequences
        assert seq is not None
        if self._deferred_keys and seq.key_of(item) in self._deferred_keys:
            return True
        key = seq.needs_state(item)
        if key is None:
            return False
        sent_us = item.request.sent_us  # else the record's timestamp: when it was produced
        self._deferred_keys[key] = (item, sent_us / 1e6 if sent_us > 0 else record.timestamp / 1e3)
        return True

    async def _resume(self, done: Completed) -> None:
        """Take up the sequences this fetch's deferred requests belong to, with the states
        Redis keeps for them (``workers/sequences.py``), then queue those requests in their
        order. Where Redis keeps none (the sequence never started, or ended), or one made
        more than the idle time before the request was sent, the batcher refuses them as
        not started, as before."""
        seq = self.sequences
        assert seq is not None
        deferred, self._deferred = self._deferred, []
        firsts, self._deferred_keys = self._deferred_keys, {}
        keys = [seq.state_keys_for(key) for key in firsts]
        # read again until Redis answers (the writer waits for it too): a sequence is not
        # refused for a moment's outage
        what = f"reading {len(keys)} sequence states"
        stored = await until_done(lambda: read_states(self.redis, keys), what, self._stopping)
        refused: dict[SequenceKey, PlazaError] = {}
        for (key, (first, sent)), data in zip(firsts.items(), stored, strict=True):
            # none kept, or an END's empty one (refused below as not started), or revoked
            # meanwhile (the sequence is the next owner's)
            if not data or first.partition in self._moved:
                continue
            try:
                seq.resume(key, data, first, sent)
            except QueueFull as exc:
                refused[key] = exc
            except Exception as exc:  # not a state this worker wrote: the sequence is lost
                log.warning("%s: sequence %r's kept state is unreadable: %s", self.id, key, exc)
        for item, deliveries, record, now_mono, now_wall in deferred:
            if item.partition in self._moved:
                continue  # revoked while the states were read: the next owner replays it
            item_key = seq.key_of(item)
            err = None if item_key is None else refused.get(item_key)
            if err is None:
                self._queue(item, deliveries, record, done, now_mono, now_wall, defer=False)
                continue
            self._refuse(item, err, done)

    def _topic_level(self, topic: str) -> int:
        """``names.topic_level`` of one of our request topics, remembered (asked per record)."""
        level = self._levels.get(topic)
        if level is None:
            level = self._levels[topic] = self.names.topic_level(self.model, topic)
        return level

    def _hold(self, key: RecordKey, nbytes: int, deliveries: int) -> None:
        if key in self._held:  # the same record again (a replay within one assignment)
            return
        self._held[key] = Held(nbytes, deliveries)
        self.pending_bytes += nbytes
        self.peak_pending_bytes = max(self.peak_pending_bytes, self.pending_bytes)
        if not self._record_bytes:
            self._record_bytes = float(max(nbytes, 1))
        self._record_bytes += (nbytes - self._record_bytes) / 16  # a running mean

    def _finish(self, keys: list[RecordKey]) -> None:
        """These records are done (answer durable, or dead-lettered): release them, and
        have the committer commit them (whatever finished them: a partition's last records
        may be dead letters, which nothing after them would ever commit)."""
        for tp, offset in keys:
            self.offsets.done(tp, offset)
            held = self._held.pop((tp, offset), None)
            if held is not None:
                self.pending_bytes -= held.nbytes
        self.deliveries.finished([(tp.topic, tp.partition, off) for tp, off in keys])
        if keys:
            self._commit_due.set()

    async def _dead_letter(self, tp: TopicPartition, record: Record, error: PlazaError) -> None:
        self.metrics.count("dead_lettered")
        topic = self.names.dead_letter_topic(self.model)
        # retried until it goes through (the record is finished only then), or until the
        # worker stops: a failed dead letter never stops the worker
        await dead_letter(self.producer, topic, tp, record, error, self.id, self._stopping)

    def _lag(self) -> int:
        """Records in our partitions that Kafka holds but we have not fetched yet: up to
        the last stable offset (``read_committed`` reads no further; it is the highwater
        where no transaction is open), from the position (past markers and aborted
        transactions, which are never fetched as records)."""
        lags: dict[TopicPartition, int] = {}
        for tp, position in self._fetched.items():
            stable = self.consumer.last_stable_offset(tp)
            high = stable if stable is not None and stable >= 0 else self.consumer.highwater(tp)
            if high is not None:
                lags[tp] = max(0, high - position)
        self.metrics.lags = lags
        return sum(lags.values())

    # -- scheduling ------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        # The batcher's due times are a fraction of a millisecond apart at low load, finer
        # than the loop's own timers keep (plaza/due_timer.py).
        due = DueTimer(self._arrived)
        try:
            await self._schedule(due)
        finally:
            due.close()

    async def _schedule(self, due: DueTimer) -> None:
        while True:
            self._arrived.clear()
            if self._suspects:
                await self._try_suspect(self._suspects.popleft())
                continue
            # A batch forms only once an instance is free to run it: formed earlier, it would
            # wait frozen, its requests' timeouts no longer applied and later ones shut out.
            holding = bool(len(self.batcher))
            if holding:
                await self._instance_free.acquire()
            decision = self.batcher.decide(backlog=self._lag())
            if holding and not decision.batch:
                self._instance_free.release()
            if decision.expired:
                await self._results.put(self._timeouts(decision.expired))
            if decision.refused:
                await self._results.put(self._refusals(decision.refused))
            if decision.batch:
                await self._launch(decision.batch)
                continue
            if self._stopping.is_set() and not len(self.batcher):
                return
            # Sleep until something arrives, or until the batcher's next due time.
            due.arm(decision.wake_at)
            await self._arrived.wait()

    async def _unanswered(
        self, batch: list[WorkItem], *, in_flight: bool = False
    ) -> list[WorkItem]:
        """The items of ``batch`` to run: those already answered (cancelled by their
        callers, or replays of answered requests) are finished here, unrun (``in_flight``:
        the batch counts as in flight, and those leave it once finished)."""
        look = await self.answered.look(batch)
        batch, answered = look.run, look.answered
        if answered:
            if self.sequences is not None:
                self.sequences.release(answered)
                await self.sequences.drop_before_starts(self.redis, answered)
            self.metrics.count("skipped", len(answered))
            self.metrics.cancelled(look.cancelled)
            done = [(it.partition, it.offset) for it in answered]
            await self._results.put(
                Completed(
                    records=done, in_flight=len(answered) if in_flight else 0, skipped=answered
                )
            )
        return batch

    async def _launch(self, batch: list[WorkItem]) -> None:
        """Run ``batch`` on the instance taken for it (``_instance_free``), which its
        execution gives back; given back here if the batch does not run."""
        started = False
        try:
            started = await self._start_execution(batch)
        finally:
            if not started:
                self._instance_free.release()

    async def _start_execution(self, batch: list[WorkItem]) -> bool:
        """Wait for a grant (the batch counts as in flight meanwhile), then run the batch
        as a task of its own, so the next one forms while this one computes; False if
        none of it runs."""
        batch = await self._unanswered(batch)
        if not batch:
            return False
        self._in_flight += len(batch)
        self._idle.clear()
        asked = granted = time.monotonic()
        grant: Grant | None = None
        try:
            grant = await self.device.acquire(self.device_key)
            granted = time.monotonic()
            if granted - asked > RECHECK_AFTER_S:
                # The grant waited for another execution: the requests cancelled meanwhile
                # are skipped too, as by the look above (which they passed).
                batch = await self._unanswered(batch, in_flight=True)
                if not batch:
                    self.device.finish(grant, time.monotonic() - granted)
                    return False
        except BaseException:
            if grant is not None:
                self.device.finish(grant, time.monotonic() - granted)
            self._in_flight -= len(batch)
            if self._in_flight == 0:
                self._idle.set()
            if self.sequences is not None:
                self.sequences.release(batch)
            raise
        task = asyncio.create_task(self._run(batch, grant, counted=True), name="execution")
        self._executions.add(task)
        task.add_done_callback(self._execution_done)
        return True

    def _execution_done(self, task: asyncio.Task[None]) -> None:
        self._executions.discard(task)
        self._instance_free.release()
        exc = None if task.cancelled() else task.exception()
        if exc is not None and self._failed is not None and not self._failed.done():
            self._failed.set_exception(exc)

    async def _run(
        self, batch: list[WorkItem], grant: Grant | None = None, *, counted: bool = False
    ) -> None:
        """Run ``batch`` on a granted instance (waiting for a grant if none is given)."""
        if not counted:
            self._in_flight += len(batch)
            self._idle.clear()
        if grant is None:
            grant = await self.device.acquire(self.device_key)
        started = time.monotonic()
        seq = self.sequences
        try:
            await self._batch_starts(batch)
            results = await self.instances[grant.instance].run(
                batch if seq is None else seq.prepare(batch), self._responses
            )
        except BaseException:
            if seq is not None:
                seq.release(batch)
            raise
        finally:
            self.device.finish(grant, time.monotonic() - started)
        states: list[StateWrite] = []
        if seq is not None:
            results, states = seq.complete(batch, results)
            self._arrived.set()  # the sequences' next requests may run now
        await self._results.put(
            Completed(
                answers=[
                    (r, it.request.reply.stream) for r, it in zip(results, batch, strict=True)
                ],
                records=[(it.partition, it.offset) for it in batch],
                in_flight=len(batch),
                states=states,
            )
        )

    def _response_sink(self) -> ResponseSink | None:
        """Where a decoupled model's responses go on their way to the writer: a bounded
        buffer that the writer empties before it writes anything else
        (``workers/responses.py``), woken through the results queue."""
        if not self.spec.decoupled:
            return None
        loop = asyncio.get_running_loop()

        def wake() -> None:
            loop.call_soon_threadsafe(self._wake_writer)

        limit = self.settings.worker.max_waiting_responses
        buffer = ResponseBuffer(wake, lambda: self._writes_closed, limit)
        self._response_buffer = buffer
        return lambda item, result: buffer.add((result, item.request.reply.stream))

    async def _cancel_loop(self, backends: list[CancellableBackend]) -> None:
        """The running requests of ``backends`` (a Python model's, any of them) whose
        callers went away: every ``CANCEL_CHECK_S``, one pipelined look at their result keys
        (a caller that goes away stores a ``cancelled`` answer there, first write wins), and
        the model is told of those found (``is_cancelled``). Its answers after that reach no
        one: its (final) answer is not written over the cancelled one."""
        while True:
            await asyncio.sleep(CANCEL_CHECK_S)
            running = [(backend, rid) for backend in backends for rid in backend.running()]
            if not running:
                continue
            pipe = self.redis.pipeline(transaction=False)
            for _, rid in running:
                pipe.exists(self.names.result_key(rid))
            try:
                found = await pipe.execute()
            except Exception as exc:  # Redis away: look again next time
                log.debug("%s: cancel look failed: %s", self.id, exc)
                continue
            cancelled: dict[CancellableBackend, list[str]] = {}
            for (backend, rid), exists in zip(running, found, strict=True):
                if exists:
                    cancelled.setdefault(backend, []).append(rid)
            for backend, ids in cancelled.items():
                backend.cancel(ids)

    def _wake_writer(self) -> None:
        """Ask the writer to take the responses waiting. A full queue needs no call: the
        writer takes them with the next thing it gets."""
        with contextlib.suppress(asyncio.QueueFull):
            self._results.put_nowait(Completed())

    async def _batch_starts(self, batch: list[WorkItem]) -> None:
        """``batch`` starts to run: its records are marked running (sent before the model
        runs, not waited for: ``DeliveryCounter.running``), so that a crash now makes them,
        and only them, suspects on the next owner; their levels have room again."""
        self._space.set()
        running = [(it.partition.topic, it.partition.partition, it.offset) for it in batch]
        await self.deliveries.running([r for r in running if r[2] >= 0])

    async def _try_suspect(self, suspect: Suspect) -> None:
        """Run a suspect alone once all before it is durable, so that a crash now is
        charged to it alone; dead-letter it (a poison record) once it has used up its
        ``max_deliveries``: the first delivery in a batch, then one trial per delivery.
        One that expired meanwhile is answered with a timeout error, as the batcher would."""
        await self._idle.wait()
        item, tp = suspect.item, suspect.item.partition
        if suspect.expires is not None and suspect.expires <= time.monotonic():
            # expired while it waited (a worker's restart): answered, not run nor charged
            if self.sequences is not None:
                self.sequences.release([item])  # a START unstarts it, as in the batcher
            await self._results.put(self._timeouts([item]))
            return
        trials = await self.deliveries.trial((tp.topic, tp.partition, item.offset))
        if trials < self.settings.worker.max_deliveries:
            if await self._unanswered([item]):
                if self.sequences is not None:
                    try:
                        self.sequences.batcher.adopt(item)
                    except PlazaError as exc:
                        await self._results.put(self._refusals([(item, exc)]))
                        return
                await self._run([item])
            return
        req = item.request
        err = PoisonRecord(
            f"request {req.id!r} was delivered {trials + 1} times and every worker that ran it "
            f"stopped before answering; it was moved to the dead-letter topic"
        )
        await self._dead_letter(tp, suspect.record, err)
        self.metrics.count("rejected")
        answer = (
            error_result(req, err, version=str(item.version), worker=self.id),
            req.reply.stream,
        )
        done = Completed([answer], [(tp, item.offset)])
        if self.sequences is not None:  # a START never ran: its sequence is not started
            self.sequences.release([item])
            done.states = self.sequences.unrun_starts([item])
        await self._results.put(done)

    def _timeouts(self, items: list[WorkItem]) -> Completed:
        self.metrics.count("expired", len(items))
        err = DeadlineExceeded("the request's deadline passed before it could run")
        done = self._errors([(it, err) for it in items])
        if self.sequences is not None:  # a START among them drops its sequence's state
            done.states = self.sequences.unrun_starts(items)
        return done

    def _refusals(self, refused: list[tuple[WorkItem, PlazaError]]) -> Completed:
        """Requests the batcher will not run (a sequence's request after its END)."""
        self.metrics.count("rejected", len(refused))
        return self._errors(refused)

    def _errors(self, failed: list[tuple[WorkItem, PlazaError]]) -> Completed:
        answers: list[Answer] = [
            (
                error_result(it.request, err, version=str(it.version), worker=self.id),
                it.request.reply.stream,
            )
            for it, err in failed
        ]
        return Completed(answers, [(it.partition, it.offset) for it, _ in failed])

    # -- writing and committing -----------------------------------------------------------
    async def _write_loop(self) -> None:
        while True:
            done = await self._results.get()
            try:
                buffer = self._response_buffer
                if buffer is not None and len(buffer):  # before their requests' final ones
                    await self.writer.write_until_done(buffer.take())
                written = await self.writer.write_until_done(done.answers, states=done.states)
                firsts = await self._first_answers(done.answers, written)
                self.metrics.answered(firsts)
                self.metrics.count("written", len(firsts))
                self.metrics.count("duplicate", len(done.answers) - len(firsts))
                if done.skipped:
                    await self._resend(done.skipped)
                self._finish(done.records)
                self._in_flight -= done.in_flight
                if self._in_flight == 0:
                    self._idle.set()
                self._space.set()
            finally:
                self._results.task_done()

    async def _resend(self, skipped: list[WorkItem]) -> None:
        """Send the stored answers of requests found answered to their reply streams again,
        where a producer's retry under the same id waits (``workers/answered.py``), before
        their records are finished."""
        ttl_s, decoupled = self.settings.redis.result_ttl_s, self.spec.decoupled
        await self.answered.resend(self.writer, skipped, ttl_s, decoupled, self.id)

    async def _first_answers(self, answers: list[Answer], written: int) -> list[Answer]:
        """Those of ``answers`` that were their requests' first (the others lost to an
        answer stored before them, a replay's: counted by the run that answered first)."""
        if written == len(answers):
            return answers
        results = [result for result, _ in answers]
        payloads = await self.writer.stored_payloads(results)
        firsts = await self.answered.first_writes(results, payloads)
        return [answer for answer, first in zip(answers, firsts, strict=True) if first]

    async def _commit_loop(self) -> None:
        """Commit what became safe, one commit at a time, apart from the writer: the next
        batch's write does not wait for Kafka's answer, and the batches written meanwhile
        (and for ``worker.commit_interval_ms`` after a commit) share the next one. A commit
        that failed or did not finish is tried again after a pause that doubles up to
        ``MAX_DELAY_S``, its offsets held meanwhile."""
        spacing_s = self.settings.worker.commit_interval_ms / 1000
        backoff_s = FIRST_DELAY_S
        while True:
            await self._commit_due.wait()
            self._commit_due.clear()
            if await self._commit():
                backoff_s = FIRST_DELAY_S
            else:  # its offsets stay: try again, however idle the worker, without spinning
                await asyncio.sleep(max(spacing_s, backoff_s))
                backoff_s = min(MAX_DELAY_S, backoff_s * 2)
                self._commit_due.set()
                continue
            if spacing_s:
                await asyncio.sleep(spacing_s)

    async def _commit(self) -> bool:
        """Whether nothing is left to retry (``commit_owned``)."""
        async with self._commit_lock:
            return await self._commit_now()

    async def _commit_now(self) -> bool:
        return await commit_owned(self.consumer, self.offsets, self.id)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish and commit what is in flight; pending records go to the next owner."""
        if not revoked or not self._tasks:
            return
        self._moved |= revoked
        if self.sequences is not None:
            self.sequences.forget(revoked)
        dropped = self.batcher.remove_if(lambda it: it.partition in revoked)
        dropped += [s.item for s in self._suspects if s.item.partition in revoked]
        self._suspects = deque(s for s in self._suspects if s.item.partition not in revoked)
        self._space.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 30)
            await asyncio.wait_for(self._results.join(), 30)
        await self._commit()
        self.offsets.forget(revoked)
        for tp in revoked:
            self._fetched.pop(tp, None)
        await self._hand_back(revoked)
        log.info(
            "%s: revoked %d partitions, %d pending requests left for the next owner",
            self.id,
            len(revoked),
            len(dropped),
        )

    async def _hand_back(self, revoked: set[TopicPartition]) -> None:
        """Release the records left for the next owner; a first delivery's counter goes
        (it did not crash anyone), a suspect's stays so its count goes on."""
        innocent: list[tuple[str, int, int]] = []
        for key in [k for k in self._held if k[0] in revoked]:
            held = self._held.pop(key)
            self.pending_bytes -= held.nbytes
            if held.deliveries <= 1:
                innocent.append((key[0].topic, key[0].partition, key[1]))
        self.deliveries.finished(innocent)
        await self.deliveries.flush()

    # -- registry --------------------------------------------------------------------------
    generation: int | None = None
    """The model table's generation this worker serves, named in its registry entry (set by
    the model host that starts it, or from ``worker.generation`` in a worker of one model:
    ``workers/main.py``; ``plaza.model_control.serves_generation``); None: a worker not
    started from the table."""

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.worker.heartbeat_interval_s)
            await self._beat()
            await self.deliveries.flush()  # answered records' counters, when intake is idle

    async def _beat(self) -> None:
        ttl = 3 * self.settings.worker.heartbeat_interval_s
        now = time.time()
        key = self.names.worker_registry_key(self.model)
        info = json.dumps(
            {
                "model": self.model,
                "generation": self.generation,
                "versions": self.versions,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "pending": self._pending(),
                "pending_bytes": self.pending_bytes,
                "peak_pending_bytes": self.peak_pending_bytes,
                "metrics_port": self.metrics.port,
            }
        )
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(key, {self.id: now + ttl})
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.expire(key, int(ttl) + 1)  # the registry itself goes when every worker has
            pipe.set(self.names.worker_info_key(self.id), info, ex=max(1, int(ttl)))
            await self.metrics.flush_with(pipe)  # executes the pipe, statistics included
        except Exception as exc:  # Redis restarting: the next beat tries again
            log.warning("%s: heartbeat failed: %s", self.id, exc)
        await self.log_settings.follow_stored(self.redis, self.names.log_settings_key())
