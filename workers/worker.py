"""The worker: one model, one consumer-group member, four cooperating tasks.

- intake: fetches records (bounded by ``max_pending``), admits them into the batcher, answers
  invalid ones at once and dead-letters unreadable ones;
- scheduler: asks the batcher for the next batch (depth = pending + consumer lag) and runs it
  on the executor thread, so fetching and writing go on while the model computes;
- writer: writes each batch's results to Redis in one round trip, then commits the offsets
  that became safe (only after the results are durable);
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from plaza.batching import BatchingPolicy, DynamicBatcher
from plaza.connections import ensure_topics, kafka_consumer, kafka_producer, redis_client
from plaza.contract import InferResult
from plaza.errors import ConfigError, DeadlineExceeded, InvalidInput, QueueFull
from plaza.modelconfig import ModelSpec
from plaza.naming import (
    HEADER_ERROR_CODE,
    HEADER_ERROR_MESSAGE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.admission import DeadLetter, Rejected, admit, monotonic_deadline
from plaza.workers.backends import Backend, create_backend
from plaza.workers.device import select_device
from plaza.workers.metrics import WorkerMetrics
from plaza.workers.offsets import OffsetTracker
from plaza.workers.runner import BatchRunner, WorkItem, error_result
from plaza.workers.writer import ResultWriter

log = logging.getLogger(__name__)
Answer = tuple[InferResult, str | None]
Fetched = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]


@dataclass(slots=True)
class Completed:
    """Answers ready to write, and the records they finish."""

    answers: list[Answer] = field(default_factory=list)
    records: list[tuple[TopicPartition, int]] = field(default_factory=list)
    in_flight: int = 0
    """How many of them the scheduler counted as in flight."""


@dataclass(slots=True)
class WorkerStats:
    """Counters a metrics exporter or a test can read."""

    fetched: int = 0
    batches: int = 0
    inferences: int = 0
    rejected: int = 0
    expired: int = 0
    dead_lettered: int = 0
    written: int = 0
    duplicates_suppressed: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._worker._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info(
            "%s: assigned %s", self._worker.id, sorted(f"{t.topic}:{t.partition}" for t in assigned)
        )


class Worker:
    """Serves one model from its Kafka topic(s) until stopped."""

    def __init__(self, settings: PlazaSettings) -> None:
        if not settings.worker.model:
            raise ConfigError("worker.model is required (--worker.model NAME)")
        self.settings = settings
        self.model = settings.worker.model
        self.names = settings.names
        self.id = settings.worker.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.stats = WorkerStats()
        self.metrics = WorkerMetrics(
            self.model, self.names, settings.worker, stats_ttl_s=settings.redis.stats_ttl_s
        )
        self.offsets = OffsetTracker()
        self._fetched: dict[TopicPartition, int] = {}
        self._in_flight = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._backends: dict[int, Backend] = {}

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model, create topics, join the group; returns once serving."""
        ws = self.settings.worker
        self._stopping = asyncio.Event()
        self._arrived = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._results: asyncio.Queue[Completed] = asyncio.Queue(maxsize=4)
        repo = ModelRepository(self.settings.repository)
        self.spec: ModelSpec = repo.spec(self.model)
        self.versions = [mv.version for mv in repo.served_versions(self.model, self.spec)]
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"infer-{self.model}")
        await self._load_backends(repo)
        self.policy = BatchingPolicy.from_spec(self.spec)
        self.batcher: DynamicBatcher[WorkItem] = DynamicBatcher(self.policy)
        self.runner = BatchRunner(
            self.spec, self._backends, self._executor, self.id, observer=self.metrics.executed
        )
        self.topics = [self.names.request_topic(self.model, lv) for lv in self.policy.levels]
        await ensure_topics(
            self.settings.kafka, [*self.topics, self.names.dead_letter_topic(self.model)]
        )
        self.redis = redis_client(self.settings.redis)
        self.writer = ResultWriter(self.redis, self.settings.redis, self.names)
        self.producer: AIOKafkaProducer = kafka_producer(self.settings.kafka)
        await self.producer.start()
        self.consumer: AIOKafkaConsumer = kafka_consumer(
            self.settings.kafka,
            self.names.consumer_group(self.model),
            max_partition_fetch_bytes=max(1 << 20, self.settings.kafka.max_request_bytes * 2),
        )
        self.consumer.subscribe(self.topics, listener=_Rebalance(self))
        await self.consumer.start()
        self.metrics.start(self.versions, pending=lambda: len(self.batcher) + self._in_flight)
        await self._beat()
        spawn = asyncio.create_task
        self._tasks = [
            spawn(self._intake_loop(), name="intake"),
            spawn(self._schedule_loop(), name="scheduler"),
            spawn(self._write_loop(), name="writer"),
            spawn(self._heartbeat_loop(), name="heartbeat"),
        ]
        log.info(
            "worker %s serving %s versions %s from %s (max_pending %d)",
            self.id,
            self.model,
            self.versions,
            self.topics,
            ws.max_pending,
        )

    async def _load_backends(self, repo: ModelRepository) -> None:
        device = select_device(self.settings.worker.device)
        loop = asyncio.get_running_loop()
        for mv in repo.served_versions(self.model, self.spec):
            backend = create_backend(mv, device, self.settings.worker.intra_op_threads)
            await loop.run_in_executor(self._executor, backend.load)
            self._backends[mv.version] = backend

    async def run_until_stopped(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set or a task fails (then re-raise after stopping)."""
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        failed = [t for t in done if t is not waiter and t.exception() is not None]
        await self.stop()
        if failed:
            raise failed[0].exception()  # type: ignore[misc]

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop fetching, finish what is pending, commit, leave the group."""
        if not self._tasks:
            return
        self._stopping.set()
        intake, scheduler, writer, heartbeat = self._tasks
        intake.cancel()
        self._arrived.set()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
            await asyncio.wait_for(scheduler, drain_timeout_s)
        log.debug("%s: stop: scheduler done=%s", self.id, scheduler.done())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._results.join(), drain_timeout_s)
        log.debug("%s: stop: results written", self.id)
        await self._commit()
        log.debug("%s: stop: committed", self.id)
        for task in (writer, heartbeat, scheduler, intake):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.metrics.close(self.redis)  # the last statistics flush; /metrics goes away
        with contextlib.suppress(Exception):
            await self.redis.zrem(self.names.worker_registry_key(self.model), self.id)
        await self.consumer.stop()
        await self.producer.stop()
        await self.redis.aclose()
        for backend in self._backends.values():
            backend.unload()
        self._executor.shutdown(wait=False)
        log.info("worker %s stopped", self.id)

    # -- intake ----------------------------------------------------------------------------
    async def _intake_loop(self) -> None:
        ws = self.settings.worker
        while True:
            room = ws.max_pending - len(self.batcher) - self._in_flight
            if room <= 0:
                self._space.clear()
                await self._space.wait()
                continue
            fetched = await self._fetch(room)
            done = Completed()
            for tp, records in fetched.items():
                for record in records:
                    await self._take(tp, record, done)
            if done.records:
                await self._results.put(done)
            self._arrived.set()

    async def _fetch(self, room: int) -> Fetched:
        """Records to take in, highest priority level first: the fetcher buffers every
        partition, and lower levels are read only when the higher ones have nothing."""
        limit = min(room, self.settings.worker.fetch_max_records)
        if len(self.topics) > 1:
            levels: dict[int, list[TopicPartition]] = {}
            for tp in self.consumer.assignment():
                level = self.names.topic_level(self.model, tp.topic)
                levels.setdefault(max(1, level), []).append(tp)
            for level in sorted(levels):
                got: Fetched = await self.consumer.getmany(
                    *levels[level], timeout_ms=0, max_records=limit
                )
                if got:
                    return got
        waited: Fetched = await self.consumer.getmany(timeout_ms=200, max_records=limit)
        return waited

    async def _take(
        self, tp: TopicPartition, record: ConsumerRecord[Any, Any], done: Completed
    ) -> None:
        self.stats.fetched += 1
        self._fetched[tp] = record.offset + 1
        self.offsets.started(tp, record.offset)
        verdict = admit(
            record.value,
            self.spec,
            self.versions,
            max_bytes=self.settings.kafka.max_request_bytes,
            worker_id=self.id,
        )
        if isinstance(verdict, DeadLetter):
            await self._dead_letter(tp, record, verdict)
            self.offsets.done(tp, record.offset)
            return
        if isinstance(verdict, Rejected):
            self.stats.rejected += 1
            done.answers.append((verdict.result, verdict.reply_stream))
            done.records.append((tp, record.offset))
            return
        verdict.partition, verdict.offset = tp, record.offset
        req = verdict.request
        try:
            self.batcher.add(
                verdict,
                size=verdict.rows,
                priority=req.priority or self.names.topic_level(self.model, tp.topic),
                deadline=monotonic_deadline(req, time.monotonic(), time.time()),
            )
        except (QueueFull, InvalidInput) as exc:  # a full level, or a negative priority
            self.stats.rejected += 1
            done.answers.append((error_result(req, exc, worker=self.id), req.reply.stream))
            done.records.append((tp, record.offset))

    async def _dead_letter(
        self, tp: TopicPartition, record: ConsumerRecord[Any, Any], verdict: DeadLetter
    ) -> None:
        self.stats.dead_lettered += 1
        headers = [
            *(record.headers or ()),
            (HEADER_ERROR_CODE, verdict.error.code.encode()),
            (HEADER_ERROR_MESSAGE, verdict.error.message.encode()[:1024]),
            (HEADER_SOURCE_TOPIC, tp.topic.encode()),
            (HEADER_SOURCE_PARTITION, str(tp.partition).encode()),
            (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
        ]
        log.warning(
            "%s: dead-lettering %s:%d:%d: %s",
            self.id,
            tp.topic,
            tp.partition,
            record.offset,
            verdict.error.message,
        )
        await self.producer.send_and_wait(
            self.names.dead_letter_topic(self.model),
            value=record.value,
            key=record.key,
            headers=headers,
        )

    def _lag(self) -> int:
        """Records in our partitions that Kafka holds but we have not fetched yet."""
        lags: dict[TopicPartition, int] = {}
        for tp, position in self._fetched.items():
            high = self.consumer.highwater(tp)
            if high is not None:
                lags[tp] = max(0, high - position)
        self.metrics.lags = lags
        return sum(lags.values())

    # -- scheduling ------------------------------------------------------------------------
    async def _schedule_loop(self) -> None:
        while True:
            self._arrived.clear()
            decision = self.batcher.decide(backlog=self._lag())
            if decision.expired:
                await self._results.put(self._timeouts(decision.expired))
            if decision.batch:
                await self._run(decision.batch)
                continue
            if self._stopping.is_set() and not len(self.batcher):
                return
            # Sleep until something arrives, or until the batcher's next due time.
            timeout = None
            if decision.wake_at is not None:
                timeout = max(0.0, decision.wake_at - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout)

    async def _run(self, batch: list[WorkItem]) -> None:
        self._in_flight += len(batch)
        self._idle.clear()
        results = await self.runner.run(batch)
        rows = sum(it.rows for it in batch)
        self.stats.batches += 1
        self.stats.inferences += len(batch)
        self.stats.batch_sizes[rows] = self.stats.batch_sizes.get(rows, 0) + 1
        await self._results.put(
            Completed(
                answers=[
                    (r, it.request.reply.stream) for r, it in zip(results, batch, strict=True)
                ],
                records=[(it.partition, it.offset) for it in batch],
                in_flight=len(batch),
            )
        )

    def _timeouts(self, items: list[WorkItem]) -> Completed:
        self.stats.expired += len(items)
        answers: list[Answer] = []
        for it in items:
            err = DeadlineExceeded("the request's deadline passed before it could run")
            answers.append(
                (
                    error_result(it.request, err, version=str(it.version), worker=self.id),
                    it.request.reply.stream,
                )
            )
        return Completed(answers, [(it.partition, it.offset) for it in items])

    # -- writing and committing -----------------------------------------------------------
    async def _write_loop(self) -> None:
        while True:
            done = await self._results.get()
            try:
                written = await self.writer.write_until_done(done.answers)
                self.metrics.answered(done.answers)
                self.stats.written += written
                self.stats.duplicates_suppressed += len(done.answers) - written
                for tp, offset in done.records:
                    self.offsets.done(tp, offset)
                self._in_flight -= done.in_flight
                if self._in_flight == 0:
                    self._idle.set()
                self._space.set()
                await self._commit()
            finally:
                self._results.task_done()

    async def _commit(self) -> None:
        offsets = self.offsets.to_commit()
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:  # rebalancing, or partitions gone: replay is idempotent
            log.warning("%s: commit of %d partitions failed: %s", self.id, len(offsets), exc)
            return
        self.offsets.committed(offsets)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Finish and commit what is in flight; pending records go to the next owner."""
        if not revoked or not self._tasks:
            return
        dropped = self.batcher.remove_if(lambda it: it.partition in revoked)
        self._space.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 30)
            await asyncio.wait_for(self._results.join(), 30)
        await self._commit()
        self.offsets.forget(revoked)
        for tp in revoked:
            self._fetched.pop(tp, None)
        log.info(
            "%s: revoked %d partitions, %d pending requests left for the next owner",
            self.id,
            len(revoked),
            len(dropped),
        )

    # -- registry --------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.worker.heartbeat_interval_s)
            await self._beat()

    async def _beat(self) -> None:
        ttl = 3 * self.settings.worker.heartbeat_interval_s
        now = time.time()
        key = self.names.worker_registry_key(self.model)
        info = json.dumps(
            {
                "model": self.model,
                "versions": self.versions,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "pending": len(self.batcher),
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
