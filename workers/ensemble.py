"""The ensemble runner: serves a ``platform: "ensemble"`` model by calling its steps' models.

An ensemble is a model like any other to its callers: it has its own request topic
(``Names.request_topic``), and HTTP, gRPC, the SDK and raw Kafka producers publish to it
and read the answer from its result key or reply stream. What consumes that topic is not a
worker with a backend but an ``EnsembleRunner``, a member of the ensemble's consumer group.
For each request it runs the step graph (``plaza.ensembles``):

- only the steps that the requested outputs need run (all outputs when the request names
  none), as Triton prunes its ensembles (``plaza.ensembles.needed_by``);
- a step starts as soon as every ensemble tensor it reads exists (steps that do not depend
  on each other run at once; one step's output may feed several steps); an optional
  ensemble input the request left out counts as there, and the step's request leaves it
  out (its model must take it as optional, as in Triton);
- a step is a normal request to its model's topic, published through the producer core
  (``plaza.producer.Producer``) with the runner's own reply stream, so each step model
  batches on its own worker's queue depth, across every ensemble request in flight.
  Intermediate tensors travel through Kafka and Redis, never through a gateway;
- a step request inherits the ensemble request's ``deadline_ms``, priority (as the caller
  gave it: each step's publish settles it against the step model's priority levels) and
  parameters; its correlation id is ``<ensemble request id>.<step index>`` (``step_request_id``);
- a step's error answers the ensemble request, code kept, message prefixed with the step
  (``step 1 (model 'mlp'): ...``); the steps still running are no longer waited for.

A decoupled ensemble (``model_transaction_policy { decoupled: true }``) may have one
decoupled step: each of that step's responses runs the steps downstream of it once, and
each such branch gives the ensemble one response, in the step's order
(``workers/ensemble_responses.py``). Those responses are written as they come; the final
one goes through the writer loop like any answer.

Replay after a crash. The ensemble record's offset is committed only after its final
answer is written (``ResultWriter``: first write wins), as a worker's; and, as a worker's,
the commit moves past what the consumer hands over no record for (a transaction's markers,
an aborted transaction's records) once the records before are answered
(``workers/offsets.py``, ``follow_positions``). A runner that dies leaves its uncommitted
requests to the next member of the group, which runs them again with the same step ids:
before publishing a step it looks up the step's result key and uses a stored answer, and a
step it publishes again is skipped by the step's worker if answered meanwhile
(``workers/answered.py``); the runner then finds that answer on the result key, which it
polls while it waits. A request whose own answer is stored already (a replay, or cancelled
by its caller) is skipped. So a crash costs time, never an answer, and never a second one.
A skipped request may be a producer's retry under the same id, whose caller waits on the
reply stream it names: as a worker does, the runner sends the stored answer there again (a
decoupled ensemble's stored responses, then its final one) before the record is finished,
unless it is a caller's cancel or the record was sent before the answer was stored (a
replay, whose answer went to its stream then): ``AnsweredCheck.stored_answers``, then
``ResultWriter.resend`` (``workers/answered.py``).

Bounds: at most ``worker.max_pending`` ensemble requests (and ``worker.max_pending_bytes``
of their records) are in flight, and the consumer reads ahead a quarter of that byte budget
over the topics' partitions, as a worker's (``read_ahead``); a step waits at most until the
request's deadline (plus ``DEADLINE_GRACE_S``) or ``STEP_WAIT_S`` without one, and a place
among a step's requests in flight (``max_inflight_requests``) until that deadline too, and
only while the request has no answer (a caller that left cancelled it). Step answers live
under their result keys for ``redis.result_ttl_s``, like any answer.

Liveness: the runner heartbeats in the ensemble's worker registry (``worker_registry_key``;
a runner that a model host started names there the model table's generation it serves, as
a worker does) and flushes the ensemble's statistics there (success, failure, request time,
and each request that succeeds as one execution of its rows, as Triton counts), as a
worker; the gateway reports the ensemble ready when a runner and every step model's
workers live.

Run one with ``python -m plaza.workers.ensemble --worker.model NAME`` (the settings of
``plaza worker``); ``EnsembleRunner`` has a worker's lifecycle (``start``,
``run_until_stopped``, ``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition
from msgspec.structs import replace
from pydantic import ValidationError

from plaza.connections import ensure_topics, kafka_consumer, kafka_producer, redis_client
from plaza.contract import ErrorInfo, InferRequest, InferResult, ReplyTo
from plaza.ensembles import LATEST_VERSION, EnsembleStep, downstream_of, pruning, runnable
from plaza.errors import EXIT_RETRIABLE, ConfigError, DeadlineExceeded, InvalidInput, PlazaError
from plaza.log_settings import LogFollower, LogSettings, configure_logging
from plaza.model_control import (
    ModelTable,
    ServedConfig,
    loaded_records,
    model_spec,
    step_models,
    step_specs,
)
from plaza.model_metrics import warn_unknown_families
from plaza.modelconfig import ModelSpec
from plaza.naming import (
    step_request_id,
)
from plaza.producer import Producer
from plaza.repository import ModelRepository
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.tasks import cancel_and_wait
from plaza.tensors import Tensor
from plaza.workers import classification
from plaza.workers.admission import DeadLetter, Rejected, admit
from plaza.workers.answered import AnsweredCheck
from plaza.workers.commit import Rebalance, commit_owned
from plaza.workers.dead_letter import dead_letter
from plaza.workers.ensemble_responses import (
    AnsweredMeanwhile,
    StepFailed,
    StepResponses,
    Waits,
    ordered,
    until_failed,
)
from plaza.workers.metrics import MetricsHub, WorkerMetrics
from plaza.workers.offsets import OffsetTracker, follow_positions, read_ahead
from plaza.workers.result_lookup import ResultLookup
from plaza.workers.runner import WorkItem, error_result
from plaza.workers.writer import ResultWriter

log = logging.getLogger(__name__)
Answer = tuple[InferResult, str | None]
RecordKey = tuple[TopicPartition, int]
Finished = tuple[RecordKey | None, Answer | None]
"""A record done: its answer to write, or None (answered already, or dead-lettered); or
(None, a decoupled ensemble's response before its final one), written in its turn."""
Record: TypeAlias = ConsumerRecord[Any, Any]

STEP_WAIT_S = 300.0
"""How long a step of a request without a deadline is waited for."""
DEADLINE_GRACE_S = 5.0
"""A step of a request with a deadline is waited for until then, plus this (the step's
worker answers an expired step with a timeout when it fetches it)."""
RESULT_POLL_S = 1.0
"""While waiting for a step's reply, its result key is looked at this often (a replayed
step that its worker skipped is answered only there)."""
COMMIT_INTERVAL_S = 0.05
"""Commits of finished requests are gathered this long (one commit, many answers)."""
WRITE_BATCH = 256
"""Answers written by one call of the result writer (one Redis round trip)."""


def step_request(
    req: InferRequest,
    step: EnsembleStep,
    tensors: Mapping[str, Tensor],
    *,
    reply_stream: str,
    priority: int,
    branch: int | None = None,
) -> InferRequest:
    """The request of ``step`` for ensemble request ``req``: its inputs taken from the
    ensemble ``tensors`` (renamed to the step model's input names; one not in ``tensors``,
    an optional ensemble input the request left out, is left out), its deadline, priority
    and parameters inherited, its correlation id ``<req.id>.<step.index>`` (and
    ``.<branch>`` in a decoupled step's branch)."""
    inputs = tuple(
        replace(tensors[t], name=key) for key, t in step.input_map.items() if t in tensors
    )
    return InferRequest(
        id=step_request_id(req.id, step.index, branch),
        model=step.model_name,
        version=step.version,
        inputs=inputs,
        outputs=tuple(step.output_map),
        reply=ReplyTo(stream=reply_stream),
        deadline_ms=req.deadline_ms,
        priority=priority,
        parameters=dict(req.parameters),
        created_ms=int(time.time() * 1000),
    )


def step_outputs(step: EnsembleStep, result: InferResult) -> dict[str, Tensor]:
    """A step's answer as ensemble tensors; StepFailed for an error or a missing output."""
    if result.error is not None:
        raise StepFailed(ErrorInfo(result.error.code, f"{step.label}: {result.error.message}"))
    out: dict[str, Tensor] = {}
    for key, name in step.output_map.items():
        try:
            out[name] = replace(result.output(key), name=name)
        except KeyError:
            message = f"{step.label}: its answer has no output {key!r}"
            raise StepFailed(ErrorInfo("model_error", message)) from None
    return out


class EnsembleRunner:
    """Serves one ensemble from its Kafka topic(s) until stopped."""

    def __init__(self, settings: PlazaSettings, hub: MetricsHub | None = None) -> None:
        """``hub``: the /metrics of the host it runs in (default: one of its own)."""
        if not settings.worker.model:
            raise ConfigError("worker.model is required (--worker.model NAME)")
        self.settings = settings
        self.model = settings.worker.model
        self.names = settings.names
        self.id = settings.worker.worker_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        repo = ModelRepository.of(settings)
        self.spec: ModelSpec = model_spec(repo, self.model, settings.worker.model_config_json)
        if not self.spec.is_ensemble:
            raise ConfigError(
                f"model {self.model!r} is not an ensemble (platform {self.spec.platform!r}): "
                "run a worker for it"
            )
        self.versions = [mv.version for mv in repo.served_versions(self.model, self.spec)]
        self.step_specs = _step_specs(repo, self.spec, step_models)
        """Each step model's config: the repository's until ``start`` checks the steps
        against what they are loaded with (``_check_steps``), then that."""
        _check_step_versions(repo, self.spec, self.step_specs, None)  # again at start
        self._repo = repo
        self.streamed = _decoupled_step(self.spec, self.step_specs)
        """The decoupled step, whose every response runs the steps downstream of it."""
        self._pruned = pruning(self.spec.ensemble_steps)
        """The steps each requested-output tuple needs (``needed_by``), remembered."""
        self.branch_steps: tuple[EnsembleStep, ...] = ()
        self.before_steps = self.spec.ensemble_steps
        if self.streamed is not None:
            later = downstream_of(self.spec.ensemble_steps, self.streamed.index)
            self.branch_steps = tuple(s for s in self.spec.ensemble_steps if s.index in later)
            self.before_steps = tuple(
                s
                for s in self.spec.ensemble_steps
                if s.index not in later and s.index != self.streamed.index
            )
        self.labels = classification.labels(self.spec, repo.root / self.model)
        self.topics = self.names.request_topics(self.model, self.spec.batching.priority_levels)
        self.redis = redis_client(settings.redis)
        self.log_settings = LogFollower(LogSettings.from_level(settings.log_level))
        self.writer = ResultWriter(self.redis, settings.redis, self.names)
        self.lookup = ResultLookup(self.redis, self.names)
        self.answered = AnsweredCheck(self.redis, self.names)
        self.reply_stream = self.names.reply_stream(f"ensemble-{self.id}")
        """Where the steps' answers come back (the runner's own, as a gateway's)."""
        self.producer = Producer(
            settings,
            self.redis,
            reply_stream=self.reply_stream,
            validate=False,  # each step's worker validates; its error names the step
        )
        limit = self.spec.max_inflight_requests
        self._step_room = {
            s.index: asyncio.Semaphore(limit) for s in self.spec.ensemble_steps if limit > 0
        }
        """``max_inflight_requests``: each step's requests in flight, over all requests."""
        self.store = ResultStore(self.redis, settings.redis, self.names)
        self.step_responses = StepResponses(
            self.producer, self.lookup, self.redis, self.store, self.names
        )
        self.metrics = WorkerMetrics(
            self.model,
            self.names,
            settings.worker,
            stats_ttl_s=settings.redis.stats_ttl_s,
            hub=hub,
        )
        self.offsets = OffsetTracker()
        self._inflight: dict[RecordKey, asyncio.Task[None]] = {}
        self._inflight_bytes: dict[RecordKey, int] = {}
        self.held_bytes = 0
        """Bytes of the records in flight (``worker.max_pending_bytes`` bounds them)."""
        self._to_write: asyncio.Queue[Finished] = asyncio.Queue(maxsize=settings.worker.max_pending)
        self._space = asyncio.Event()
        self._finished = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._dead_letters: AIOKafkaProducer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError(f"ensemble runner {self.id} is not started")
        return self._consumer

    @property
    def in_flight(self) -> int:
        """Ensemble requests taken in and not answered yet."""
        return len(self._inflight)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Create the topics, start the producer core, join the group; returns once serving.
        A start that fails gives back what it took (stop() will not run): the consumer
        leaves the group, the clients close, the metrics leave the process's /metrics."""
        try:
            await self._start()
        except BaseException:
            await self._release_failed_start()
            raise

    async def _release_failed_start(self) -> None:
        closes: list[Callable[[], Awaitable[object]]] = [self.lookup.stop]
        if self._consumer is not None:
            closes.append(self._consumer.stop)
        if self._dead_letters is not None:
            closes.append(self._dead_letters.stop)
        closes += [self.producer.stop, self.writer.close, lambda: self.metrics.close(self.redis)]
        for close in closes:
            with contextlib.suppress(Exception):
                await close()
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    async def _check_steps(self) -> None:
        """Check the steps against what their models are loaded with (the model table's
        records of them; mode none: no table, the repository's): ``step_specs`` and
        ``_check_step_versions``. ConfigError before anything starts."""
        loaded = loaded_records(await ModelTable(self.redis, self.names).read())
        self.step_specs = _step_specs(
            self._repo, self.spec, lambda repo, spec: step_specs(repo, spec, loaded)
        )
        _check_step_versions(self._repo, self.spec, self.step_specs, loaded)

    async def _start(self) -> None:
        await self._check_steps()
        await ensure_topics(
            self.settings.kafka, [*self.topics, self.names.dead_letter_topic(self.model)]
        )
        await self.producer.start()
        await self.producer.replies()
        self._dead_letters = kafka_producer(self.settings.kafka)
        await self._dead_letters.start()
        self._consumer = await self._make_consumer(self._dead_letters)
        self._consumer.subscribe(self.topics, listener=Rebalance(self))
        await self._consumer.start()
        self.metrics.start(
            self.versions,
            pending=lambda: self.in_flight,
            decoupled=self.spec.decoupled,
            first_response_buckets=self.spec.first_response_buckets_ms,
            response_cache=self.spec.response_cache,
        )
        warn_unknown_families(self.spec.config)
        self.lookup.start()
        await self._beat()
        spawn = asyncio.create_task
        self._tasks = [
            spawn(self._intake_loop(), name="ensemble-intake"),
            spawn(self._write_loop(), name="ensemble-writer"),
            spawn(self._commit_loop(), name="ensemble-commit"),
            spawn(self._heartbeat_loop(), name="ensemble-heartbeat"),
        ]
        steps = ", ".join(s.label for s in self.spec.ensemble_steps)
        log.info(
            "ensemble runner %s serving %s (%s) from %s", self.id, self.model, steps, self.topics
        )

    async def _make_consumer(self, producer: AIOKafkaProducer) -> AIOKafkaConsumer:
        """The group member, its read-ahead a quarter of the byte budget over every
        partition of the ensemble's topics, as a worker's (``read_ahead``; ``producer``
        reads their metadata)."""
        kafka = self.settings.kafka
        budget = self.settings.worker.max_pending_bytes
        limits = await read_ahead(producer, self.topics, kafka, budget, self.id)
        return kafka_consumer(kafka, self.names.consumer_group(self.model), **limits)

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
        """Stop fetching, finish the requests in flight, commit, leave the group."""
        if not self._tasks:
            return
        intake = self._tasks[0]
        intake.cancel()
        running = [t for t in self._inflight.values() if not t.done()]
        if running:
            await asyncio.wait(running, timeout=drain_timeout_s)
        await cancel_and_wait(running)  # not answered in time: the group's next member replays it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._to_write.join(), drain_timeout_s)
        await self._commit()
        await cancel_and_wait(self._tasks)
        self._tasks = []
        await self.lookup.stop()
        await self.metrics.close(self.redis)
        with contextlib.suppress(Exception):
            await self.redis.zrem(self.names.worker_registry_key(self.model), self.id)
        await self.consumer.stop()
        if self._dead_letters is not None:
            await self._dead_letters.stop()
        await self.producer.stop()
        await self.writer.close()
        await self.redis.aclose()
        log.info("ensemble runner %s stopped", self.id)

    # -- intake ----------------------------------------------------------------------------
    async def _intake_loop(self) -> None:
        ws = self.settings.worker
        while True:
            room = ws.max_pending - self.in_flight
            if room <= 0 or self.held_bytes >= ws.max_pending_bytes:
                self._space.clear()
                await self._space.wait()
                continue
            limit = min(room, ws.fetch_max_records)
            fetched = await self.consumer.getmany(timeout_ms=200, max_records=limit)
            for tp, records in fetched.items():
                for record in records:
                    await self._take(tp, record)
            # the fetch is taken in: the positions, past transaction markers and aborted
            # records (never handed over), bound the commit once the records before are done
            if await follow_positions(self.consumer, self.offsets):
                self._finished.set()

    async def _take(self, tp: TopicPartition, record: Record) -> None:
        if not self.offsets.started(tp, record.offset):
            return  # revoked meanwhile: the partition's next owner replays it
        verdict = admit(
            record.value,
            self.spec,
            self.versions,
            max_bytes=self.settings.kafka.max_request_bytes,
            names=self.names,
            worker_id=self.id,
            partition=tp,
            offset=record.offset,
        )
        key = (tp, record.offset)
        if isinstance(verdict, DeadLetter):
            await self._dead_letter(tp, record, verdict.error)
            self._spawn(key, 0, _ready(None))
        elif isinstance(verdict, Rejected):
            self._spawn(key, 0, _ready((verdict.result, verdict.reply_stream)))
        else:
            priority = verdict.request.priority or self.names.topic_level(self.model, tp.topic)
            self._spawn(key, len(record.value or b""), self._answer(verdict, priority))

    def _spawn(
        self, key: RecordKey, nbytes: int, answer: Coroutine[Any, Any, Answer | None]
    ) -> None:
        if key in self._inflight:  # the same record again (a replay within one assignment)
            answer.close()
            return
        self._inflight_bytes[key] = nbytes
        self.held_bytes += nbytes
        self._inflight[key] = asyncio.create_task(self._finish(key, answer))

    async def _finish(self, key: RecordKey, answer: Coroutine[Any, Any, Answer | None]) -> None:
        """Answer one record and hand the answer to the writer."""
        try:
            await self._to_write.put((key, await answer))
        except asyncio.CancelledError:
            self._forget(key)  # revoked or stopping: the next owner replays it
            raise

    async def _write_loop(self) -> None:
        """Write finished answers (and a decoupled ensemble's responses before them, in
        their order), many a round trip; then their offsets may be committed."""
        while True:
            batch = [await self._to_write.get()]
            while len(batch) < WRITE_BATCH and not self._to_write.empty():
                batch.append(self._to_write.get_nowait())
            try:
                answers = [answer for _, answer in batch if answer is not None]
                if answers:
                    await self.writer.write_until_done(answers)
                finals = [a for key, a in batch if key is not None and a is not None]
                if finals:
                    self.metrics.answered(finals)
                for key, _ in batch:
                    if key is not None:
                        self.offsets.done(*key)
                        self._forget(key)
                self._finished.set()
            finally:
                for _ in batch:
                    self._to_write.task_done()

    def _forget(self, key: RecordKey) -> None:
        self._inflight.pop(key, None)
        self.held_bytes -= self._inflight_bytes.pop(key, 0)
        self._space.set()

    async def _dead_letter(self, tp: TopicPartition, record: Record, error: PlazaError) -> None:
        assert self._dead_letters is not None
        topic = self.names.dead_letter_topic(self.model)
        await dead_letter(self._dead_letters, topic, tp, record, error, self.id)

    # -- one ensemble request --------------------------------------------------------------
    async def _answer(self, item: WorkItem, priority: int) -> Answer | None:
        """The ensemble request's answer; None when it is answered already (not run)."""
        req = item.request
        if await self.lookup.get(req.id) is not None:
            # a replay of an answered request, a retry, or cancelled by its caller
            await self._resend(item)
            return None
        version = str(item.version)
        if req.deadline_ms is not None and req.deadline_ms <= time.time() * 1000:
            late = DeadlineExceeded("the request's deadline passed before its first step ran")
            return error_result(req, late, version=version, worker=self.id), req.reply.stream
        if self.spec.decoupled:
            return await self._answer_responses(item, priority)
        started = time.monotonic()
        try:
            outputs = self._outputs(req, await self._run_graph(req, priority))
        except AnsweredMeanwhile:
            return None  # cancelled by its caller while it waited: the answer is stored
        except Exception as exc:
            return self._failed(req, version, exc)
        result = InferResult(req.id, self.model, version, outputs, worker=self.id)
        return self._executed(item, _timed(result, item, started)), req.reply.stream

    async def _resend(self, item: WorkItem) -> None:
        """Send the stored answer of a request found answered to its reply stream again,
        where a producer's retry under the same id waits (none for a replay or a caller's
        cancel: ``AnsweredCheck.resend``), before its record is finished."""
        ttl_s, decoupled = self.settings.redis.result_ttl_s, self.spec.decoupled
        await self.answered.resend(self.writer, [item], ttl_s, decoupled, self.id)

    async def _answer_responses(self, item: WorkItem, priority: int) -> Answer | None:
        """A decoupled ensemble's request: each response but the final one handed to the
        writer loop as it comes (first write wins per response), then the final one
        returned, after which the record's offset may be committed."""
        req = item.request
        version = str(item.version)
        started = time.monotonic()
        sent = 0
        try:
            async with contextlib.aclosing(self._responses(req, priority)) as responses:
                async for outputs, last in responses:
                    result = InferResult(
                        req.id, self.model, version, outputs, worker=self.id, index=sent
                    )
                    if sent == 0:  # the first-response histogram (decoupled models only)
                        since_ns = int((time.monotonic() - item.received) * 1e9)
                        self.metrics.first_response(version, since_ns)
                    if last:
                        break
                    # through the writer loop: many responses a Redis call, in their order
                    done = replace(result, final=False)
                    await self._to_write.put((None, (done, req.reply.stream)))
                    sent += 1
                else:  # the decoupled step closed the request without a response
                    result = InferResult(
                        req.id, self.model, version, worker=self.id, index=sent, empty=True
                    )
        except AnsweredMeanwhile:
            return None  # cancelled by its caller: the answer is stored
        except Exception as exc:
            return self._failed(req, version, exc, index=sent)
        return self._executed(item, _timed(result, item, started)), req.reply.stream

    def _executed(self, item: WorkItem, result: InferResult) -> InferResult:
        """Count a request that succeeded as one execution of its rows, with its own
        compute times, as Triton's ensemble scheduler does (its batch_stats, execution and
        inference counts); the step models count their own executions."""
        self.metrics.executed([item], [result])
        return result

    def _failed(self, req: InferRequest, version: str, exc: Exception, index: int = 0) -> Answer:
        """The final answer (response ``index``) of a request that failed: a step's error
        (StepFailed), or any other exception, a bug, logged and answered all the same, or
        its offset would hold every later one."""
        if isinstance(exc, StepFailed):
            result = InferResult(req.id, self.model, version, error=exc.error, worker=self.id)
        else:
            log.exception("%s: ensemble request %s failed", self.id, req.id)
            err = PlazaError(f"ensemble {self.model!r} failed: {type(exc).__name__}: {exc}")
            result = error_result(req, err, version=version, worker=self.id)
        return replace(result, index=index), req.reply.stream

    async def _responses(
        self, req: InferRequest, priority: int
    ) -> AsyncGenerator[tuple[tuple[Tensor, ...], bool], None]:
        """A decoupled ensemble's responses, in order: (outputs, whether it is the final
        one). The steps that do not read the decoupled step's outputs run first; the
        decoupled step starts as soon as its own inputs exist, while the others among them
        go on. Each of its responses runs the steps downstream of it (a branch) once those
        others are done, and gives one response. Nothing more after the step's empty final
        response. A step that fails, anywhere, fails the request, as in a plain ensemble.
        A decoupled step that no requested output needs is pruned: one response then."""
        step = self.streamed
        if step is not None and step.index not in self._needed(req):
            step = None
        needed = () if step is None else tuple(step.input_map.values())
        absent = self._absent(req)
        fed: dict[str, Tensor] | None = None  # the tensors there when its inputs were all in
        ready = asyncio.Event()  # set once they were, or once the steps before are done

        def progress(have: Mapping[str, Tensor]) -> None:
            nonlocal fed
            if not ready.is_set() and all(t in have or t in absent for t in needed):
                fed = dict(have)
                ready.set()

        before = asyncio.create_task(
            self._run_graph(req, priority, self.before_steps, progress=progress)
        )
        before.add_done_callback(lambda _: ready.set())
        try:
            await ready.wait()
            async for answer in self._stream(req, priority, step, before, fed):
                yield answer
        finally:
            await cancel_and_wait([before])

    async def _stream(
        self,
        req: InferRequest,
        priority: int,
        step: EnsembleStep | None,
        before: asyncio.Task[dict[str, Tensor]],
        fed: Mapping[str, Tensor] | None,
    ) -> AsyncGenerator[tuple[tuple[Tensor, ...], bool], None]:
        """``_responses`` once the decoupled ``step``'s inputs are in ``fed`` (None: they
        never will be, the steps ``before`` it are done), those steps still running: one
        that fails ends the responses with its error at once, and cancels ``step``."""
        if step is None or fed is None:
            yield self._outputs(req, await before), True  # no step streams (or it cannot run)
            return
        sreq = step_request(req, step, fed, reply_stream=self.reply_stream, priority=priority)
        spec = self.step_specs.get(step.model_name)
        responses = self.step_responses.read(req.id, sreq, step, spec, self._waits(sreq))
        reading = _holding(self._room(step, req), responses)

        async def branch(response: InferResult) -> dict[str, Tensor] | None:
            have = await asyncio.shield(before)  # every step beside the decoupled one
            if response.empty:
                return None
            tensors = {**have, **step_outputs(step, response)}
            return await self._run_graph(
                req, priority, self.branch_steps, tensors, branch=response.index
            )

        try:
            async with (
                contextlib.aclosing(ordered(reading, branch)) as branches,
                # a step beside it that fails fails the request at once, not at the
                # decoupled step's next response (which may be long in coming, or never)
                contextlib.aclosing(until_failed(branches, before)) as watched,
            ):
                async for response, tensors in watched:
                    if tensors is None:
                        return
                    yield self._outputs(req, tensors), response.final
                    if response.final:
                        return
        except Exception:  # an error, a deadline, a cancelled caller: the step may stop
            # (not a runner that stops, cancelled: the step runs on for the next runner)
            await self.step_responses.cancel(sreq)
            raise

    def _waits(self, sreq: InferRequest) -> Waits:
        if sreq.deadline_ms is None:
            return Waits(RESULT_POLL_S, STEP_WAIT_S)
        left_s = max(0.0, sreq.deadline_ms / 1000 - time.time()) + DEADLINE_GRACE_S
        return Waits(RESULT_POLL_S, left_s, until=time.monotonic() + left_s)

    def _outputs(self, req: InferRequest, tensors: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
        """The outputs the request asked for (all, when it named none) from ``tensors``."""
        return tuple(self._answered(req, _output(tensors, n, self.spec)) for n in self._wanted(req))

    def _wanted(self, req: InferRequest) -> tuple[str, ...]:
        return req.outputs or tuple(o.name for o in self.spec.outputs)

    def _needed(self, req: InferRequest) -> frozenset[int]:
        """The steps the request's outputs need: the others are not run (Triton's prune)."""
        return self._pruned(self._wanted(req))

    def _absent(self, req: InferRequest) -> frozenset[str]:
        """The optional ensemble inputs the request left out: there for the steps that
        read them, which run without them (Triton's placeholder tensor for them)."""
        given = {t.name for t in req.inputs}
        return frozenset(i.name for i in self.spec.inputs if i.optional and i.name not in given)

    def _answered(self, req: InferRequest, tensor: Tensor) -> Tensor:
        """An output as the request asked it: its top classes where it asked them."""
        count = req.classification.get(tensor.name)
        if count is None:
            return tensor
        batched = self.spec.max_batch_size > 0
        return classification.classify(tensor, count, batched, self.labels.get(tensor.name, ()))

    async def _run_graph(
        self,
        req: InferRequest,
        priority: int,
        steps: tuple[EnsembleStep, ...] | None = None,
        tensors: Mapping[str, Tensor] | None = None,
        branch: int | None = None,
        progress: Callable[[Mapping[str, Tensor]], None] | None = None,
    ) -> dict[str, Tensor]:
        """Every ensemble tensor ``steps`` (default: all) produce from ``tensors`` (default:
        the request's inputs), of those steps the request's outputs need: each starts once
        its inputs exist (or are optional ensemble inputs the request left out).
        ``branch``: the decoupled step's response these steps run for (part of their step
        ids). ``progress`` is called with the tensors there, at the start and after each
        step."""
        needed = self._needed(req)
        steps = tuple(
            s for s in (self.spec.ensemble_steps if steps is None else steps) if s.index in needed
        )
        absent = self._absent(req)
        have = {t.name: t for t in req.inputs} if tensors is None else dict(tensors)
        started: set[int] = set()
        running: dict[asyncio.Task[dict[str, Tensor]], EnsembleStep] = {}
        try:
            while True:
                if progress is not None:
                    progress(have)
                for step in runnable(steps, have, started, absent):
                    started.add(step.index)
                    call = self._step(req, step, have, priority, branch)
                    running[asyncio.create_task(call)] = step
                if not running:
                    return have
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    have.update(task.result())  # StepFailed ends the request
        finally:
            await cancel_and_wait(running)

    async def _step(
        self,
        req: InferRequest,
        step: EnsembleStep,
        have: Mapping[str, Tensor],
        priority: int,
        branch: int | None,
    ) -> dict[str, Tensor]:
        sreq = step_request(
            req, step, have, reply_stream=self.reply_stream, priority=priority, branch=branch
        )
        return step_outputs(step, await self._call(req, sreq, step))

    async def _call(self, req: InferRequest, sreq: InferRequest, step: EnsembleStep) -> InferResult:
        """The step's answer: stored already (a replay), or published and awaited."""
        stored = await self.lookup.get(sreq.id)
        if stored is not None:
            return stored
        async with self._room(step, req):
            mux = await self.producer.replies()
            fut = mux.expect(sreq.id)  # before publishing: the reply may beat the ack
            try:
                try:
                    spec = self.step_specs.get(step.model_name)
                    await self.producer.publish_many([(sreq, spec)])
                except PlazaError as exc:
                    message = f"{step.label}: {exc.message}"
                    raise StepFailed(ErrorInfo(exc.code, message)) from exc
                return await self._await_step(fut, sreq, step)
            finally:
                mux.forget(sreq.id)

    @contextlib.asynccontextmanager
    async def _room(self, step: EnsembleStep, req: InferRequest) -> AsyncIterator[None]:
        """A place among the step's requests in flight (``max_inflight_requests``; none
        needed without it), held for the body, for ensemble request ``req``."""
        room = self._step_room.get(step.index)
        if room is None:
            yield
            return
        await self._take_room(room, step, req)
        try:
            yield
        finally:
            room.release()

    async def _take_room(
        self, room: asyncio.Semaphore, step: EnsembleStep, req: InferRequest
    ) -> None:
        """Wait for a place in ``room``, in turn, until the request's deadline (plus
        ``DEADLINE_GRACE_S``; without one, as long as it takes), looking at the request's
        own answer every ``RESULT_POLL_S``: StepFailed (timeout) past the deadline,
        AnsweredMeanwhile once its caller cancelled it."""
        until = None
        if req.deadline_ms is not None:
            left_s = max(0.0, req.deadline_ms / 1000 - time.time()) + DEADLINE_GRACE_S
            until = time.monotonic() + left_s
        taking = asyncio.ensure_future(room.acquire())  # one place in the queue, kept
        try:
            while True:
                wait_s = RESULT_POLL_S
                if until is not None:
                    wait_s = min(wait_s, max(0.0, until - time.monotonic()))
                done, _ = await asyncio.wait({taking}, timeout=wait_s)
                if done:
                    return
                if await self.lookup.get(req.id) is not None:
                    raise AnsweredMeanwhile(req.id)
                if until is not None and time.monotonic() >= until:
                    message = (
                        f"{step.label}: no place among its {self.spec.max_inflight_requests} "
                        "requests in flight (max_inflight_requests) before the deadline"
                    )
                    raise StepFailed(ErrorInfo(DeadlineExceeded.code, message))
        except BaseException:
            # a place that came as the wait ended is given back, even should this task
            # be cancelled again meanwhile (a cancelled acquire holds none)
            taking.add_done_callback(lambda t: _release_taken(room, t))
            taking.cancel()
            raise

    async def _await_step(
        self, fut: asyncio.Future[InferResult], sreq: InferRequest, step: EnsembleStep
    ) -> InferResult:
        limit_s = STEP_WAIT_S
        if sreq.deadline_ms is not None:
            limit_s = max(0.0, sreq.deadline_ms / 1000 - time.time()) + DEADLINE_GRACE_S
        give_up = time.monotonic() + limit_s
        while True:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(fut), RESULT_POLL_S)
            stored = await self.lookup.get(sreq.id)
            if stored is not None:
                return stored
            if time.monotonic() > give_up:
                message = f"{step.label}: no answer within {limit_s:g} s"
                raise StepFailed(ErrorInfo(DeadlineExceeded.code, message))

    # -- committing ------------------------------------------------------------------------
    async def _commit_loop(self) -> None:
        while True:
            await self._finished.wait()
            await asyncio.sleep(COMMIT_INTERVAL_S)  # gather the answers finishing meanwhile
            self._finished.clear()
            await self._commit()

    async def _commit(self) -> None:
        await commit_owned(self.consumer, self.offsets, self.id)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit what is answered; requests still running go to the next owner."""
        if not revoked or not self._tasks:
            return
        moved = [task for (tp, _), task in self._inflight.items() if tp in revoked]
        await cancel_and_wait(moved)
        await self._commit()
        self.offsets.forget(revoked)
        log.info(
            "%s: revoked %d partitions, %d requests left for the next owner",
            self.id,
            len(revoked),
            len(moved),
        )

    # -- registry --------------------------------------------------------------------------
    generation: int | None = None
    """The model table's generation this runner serves, named in its registry entry (set by
    the model host that starts it; ``plaza.model_control.serves_generation``); None: a
    runner not started from the table."""

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
                "kind": "ensemble",
                "generation": self.generation,
                "steps": [s.model_name for s in self.spec.ensemble_steps],
                "versions": self.versions,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "pending": self.in_flight,
                "metrics_port": self.metrics.port,
            }
        )
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(key, {self.id: now + ttl})
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.expire(key, int(ttl) + 1)
            pipe.set(self.names.worker_info_key(self.id), info, ex=max(1, int(ttl)))
            await self.metrics.flush_with(pipe)
        except Exception as exc:  # Redis restarting: the next beat tries again
            log.warning("%s: heartbeat failed: %s", self.id, exc)
        await self.log_settings.follow_stored(self.redis, self.names.log_settings_key())


def _timed(result: InferResult, item: WorkItem, started: float) -> InferResult:
    """``result`` with its queue time (intake to start) and its run (start to now)."""
    timing = {
        "queue": int((started - item.received) * 1e6),
        "compute_infer": int((time.monotonic() - started) * 1e6),
    }
    return replace(result, timing_us=timing)


async def _ready(answer: Answer | None) -> Answer | None:
    return answer


def _output(tensors: Mapping[str, Tensor], name: str, spec: ModelSpec) -> Tensor:
    tensor = tensors.get(name)
    if tensor is None:  # a requested name that no step makes (a raw producer may ask one)
        err = InvalidInput(f"ensemble {spec.name!r}: no step could produce output {name!r}")
        raise StepFailed(ErrorInfo(err.code, err.message))
    return tensor


def _step_specs(
    repo: ModelRepository,
    spec: ModelSpec,
    read: Callable[[ModelRepository, ModelSpec], dict[str, ModelSpec]] = step_specs,
) -> dict[str, ModelSpec]:
    """Each step model's config (its priority levels and queue policy), read by ``read``
    (``plaza.model_control.step_models`` or ``step_specs``, which checks the steps as a
    load checks them: through nested ensembles, no cycle, datatypes, shapes and batch
    sizes along each edge); ConfigError naming the ensemble and step."""
    try:
        return read(repo, spec)
    except ConfigError as exc:
        raise ConfigError(f"ensemble {spec.name!r}: {exc.message}", **exc.details) from exc


def _check_step_versions(
    repo: ModelRepository,
    spec: ModelSpec,
    step_specs: Mapping[str, ModelSpec],
    loaded: Mapping[str, ServedConfig] | None,
) -> None:
    """ConfigError for a step pinned to a ``model_version`` that its model does not serve:
    every request would fail on it (Triton refuses such an ensemble at load). A step model
    in ``loaded`` (``loaded_records``: the model table's records of the models loaded)
    serves the versions its load selected; any other, those its version policy selects
    from the repository's version folders (mode none: no table). ``loaded`` None: not read
    yet (a runner being built), so only a version no folder holds is refused."""
    for step in spec.ensemble_steps:
        if step.model_version == LATEST_VERSION:
            continue
        record = None if loaded is None else loaded.get(step.model_name)
        available = repo.available_versions(step.model_name)
        served = step_specs[step.model_name].version_policy.select(available)
        if record is not None and record.versions:
            served = sorted(record.versions)
        known = available if loaded is None else served
        if step.model_version not in known:
            raise ConfigError(
                f"ensemble {spec.name!r}: {step.label}: version {step.model_version} is not "
                f"served (its version policy serves {served})",
                field=f"ensemble_scheduling.step[{step.index}].model_version",
            )


def _release_taken(room: asyncio.Semaphore, taking: asyncio.Future[Any]) -> None:
    """Give back the place in ``room`` that ``taking`` (its ``acquire``) got, if any."""
    if not taking.cancelled() and taking.exception() is None:
        room.release()


async def _holding(
    room: contextlib.AbstractAsyncContextManager[Any], responses: AsyncGenerator[InferResult, None]
) -> AsyncGenerator[InferResult, None]:
    """``responses`` read while holding ``room`` (a decoupled step's request is in flight
    from its publish to its last response)."""
    async with room, contextlib.aclosing(responses):
        async for response in responses:
            yield response


def _decoupled_step(spec: ModelSpec, step_specs: Mapping[str, ModelSpec]) -> EnsembleStep | None:
    """The ensemble's decoupled step (None: none); ConfigError for a decoupled step in an
    ensemble that is not decoupled itself (its callers would wait for one answer), or for
    more than one."""
    found = [s for s in spec.ensemble_steps if step_specs[s.model_name].decoupled]
    if not found:
        return None
    step = found[0]
    where = f"ensemble_scheduling.step[{step.index}].model_name"
    if not spec.decoupled:
        raise ConfigError(
            f"ensemble {spec.name!r}: {step.label}: the model is decoupled (many responses "
            "per request): the ensemble must be decoupled too "
            "(model_transaction_policy { decoupled: true })",
            field=where,
        )
    if len(found) > 1:
        raise ConfigError(
            f"ensemble {spec.name!r}: {found[1].label}: a second decoupled step; Plaza's "
            f"ensembles pass on the responses of one ({step.label})",
            field=f"ensemble_scheduling.step[{found[1].index}].model_name",
        )
    return step


async def serve(settings: PlazaSettings) -> None:
    """Start a runner, serve until SIGINT/SIGTERM, then drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = EnsembleRunner(settings)
    await runner.start()
    await runner.run_until_stopped(stop)


def main(argv: list[str] | None = None) -> int:
    """``python -m plaza.workers.ensemble --worker.model NAME [settings flags]``."""
    try:
        settings = PlazaSettings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
        configure_logging(settings.log_level)
        asyncio.run(serve(settings))
    except PlazaError as exc:
        print(f"plaza ensemble: error: {exc.message}", file=sys.stderr)
        return EXIT_RETRIABLE if exc.retriable else 1
    except ValidationError as exc:
        for problem in exc.errors():
            where = ".".join(str(part) for part in problem["loc"])
            print(f"plaza ensemble: error: {where}: {problem['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
