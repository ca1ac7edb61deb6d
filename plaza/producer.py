"""The producer core: the one path by which a request enters Plaza.

The gateway's fronts (HTTP now, gRPC next) and the SDK (``plaza.client``) all publish
through ``Producer``; a front only maps its wire format to it. For each request it runs

    validate -> settle the priority level -> queue guard -> byte budget -> publish
             -> await the reply (sync) or mark the job (async)

and it owns the parts this needs: the Kafka publisher, the backlog probe behind the queue
guard, the reply multiplexer (on a stream its caller names), the job markers, and the
budget of in-flight request bytes. Errors are PlazaErrors; none of them is an HTTP status.

A sync or streamed request to a model that enables the response cache is first looked up
there (``plaza.response_cache``, owned here): a hit is answered from Redis and never
published; a successful answer to a miss is stored. Both are bounded by the call's time.

A decoupled model (``ModelSpec.decoupled``) answers a request any number of times:
``infer_stream`` yields each response as it comes, the final one last; ``infer``, which
returns one answer, refuses such a model (Unsupported) before publishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from msgspec.structs import replace

from plaza.codec import encode_result, join_results
from plaza.connections import warn_if_evicting
from plaza.contract import ErrorInfo, InferRequest, InferResult, ReplyTo
from plaza.errors import (
    CodecError,
    DeadlineExceeded,
    PayloadTooLarge,
    PlazaError,
    QueueFull,
    Unavailable,
    Unsupported,
)
from plaza.modelconfig import ModelSpec
from plaza.naming import STREAM_FIELD_COUNT, STREAM_FIELD_RESULTS
from plaza.priority import settle_level
from plaza.publisher import RequestPublisher, was_acknowledged
from plaza.queueing import BacklogProbe, QueueGuard
from plaza.replies import MAX_PENDING_RESPONSES, ReplyMux
from plaza.response_cache import CacheObserver, CacheProbe, DefaultVersions, ResponseCache
from plaza.results import JobStatus, JobView, ResultStore
from plaza.retry import redis_failure
from plaza.settings import PlazaSettings
from plaza.validation import validate_request

log = logging.getLogger(__name__)

MARK_TIMEOUT_S = 2.0
"""The longest a job marker write may take: Kafka holds the job already, and a Redis that
hangs must not hold its caller (the marker is then missing, as when Redis refuses it)."""

POLL_TIMEOUT_S = MARK_TIMEOUT_S
"""The longest a job poll waits for Redis: a Redis that hangs gets the caller an
Unavailable in this time, not after redis-py's read timeouts and retries (about a minute)."""

MAX_MARKING = 1024
"""Job marker writes in flight on tasks of their own (past a sync call's deadline); one
more past this is not written (its job is remembered as unmarked)."""

MAX_UNMARKED = 10_000
"""The jobs remembered as published without a marker (``UnmarkedJobs``), newest kept."""

DEADLINE_GRACE_S = 60.0
"""A job past its deadline is answered (timeout) when a worker next fetches it; this
covers that fetch for a marker whose wait the deadline bounds."""


def request_bytes(req: InferRequest) -> int:
    """What a request weighs against the in-flight budget: its input tensor bytes."""
    return sum(memoryview(t.data).nbytes for t in req.inputs)


class InflightBytes:
    """A budget of request bytes held while their requests are in flight.

    A request that does not fit is refused at once (QueueFull, retriable) instead of
    waiting: a caller that waits for room would hold its bytes all the same. One larger
    than the whole budget could never fit: PayloadTooLarge, not retriable.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit now."""
        return self.used + nbytes <= self.limit

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Reserve ``nbytes`` for the block; QueueFull when they do not fit now,
        PayloadTooLarge when they could never fit (more than the whole limit)."""
        if nbytes > self.limit:
            raise PayloadTooLarge(
                f"this request has {nbytes} bytes of inputs; the in-flight limit is "
                f"{self.limit} (producer.max_inflight_bytes)",
                size=nbytes,
            )
        if not self.fits(nbytes):
            raise QueueFull(
                f"{self.used} bytes of requests are in flight and this one has {nbytes}; "
                f"the limit is {self.limit} (producer.max_inflight_bytes): retry later",
                inflight_bytes=self.used,
            )
        self.used += nbytes
        try:
            yield
        finally:
            self.used -= nbytes


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request ready to publish: its priority settled, its topic chosen."""

    req: InferRequest
    topic: str
    level: int
    spec: ModelSpec | None = None
    """The model's config (None where the caller has none)."""


class _Sends:
    """The records a ``publish_many`` has sent: their ids and acknowledgements."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.acks: list[asyncio.Future[Any]] = []
        self.unawaited: list[asyncio.Future[Any]] = []
        """Acks not awaited yet (each is awaited once: a timed-out one is not waited for
        again)."""

    def add(self, req_id: str, ack: asyncio.Future[Any]) -> None:
        self.ids.append(req_id)
        self.acks.append(ack)
        self.unawaited.append(ack)

    def take_unawaited(self) -> list[asyncio.Future[Any]]:
        taken, self.unawaited = self.unawaited, []
        return taken

    def partly_published(self, exc: PlazaError, size: int) -> PlazaError:
        """``exc`` (of its own type) naming the ids Kafka acknowledged before it."""
        published = [i for i, ack in zip(self.ids, self.acks, strict=True) if was_acknowledged(ack)]
        return type(exc)(
            f"{exc.message} ({len(published)} of the batch's {size} requests were published "
            "before it: details['published_ids'])",
            **{**exc.details, "published_ids": published},
        )


class UnmarkedJobs:
    """The jobs this producer published whose marker is not (yet) written: Redis refused it
    (out of memory), did not answer, or the write is still on its way. Kafka holds them,
    so a poll that finds neither marker nor result calls them pending, not unknown, for as
    long as their marker would have lived. Bounded: the oldest are forgotten first."""

    def __init__(self, limit: int = MAX_UNMARKED) -> None:
        self._limit = limit
        self._until: dict[str, float] = {}  # id -> monotonic end of its marker's life

    def add(self, job_id: str, ttl_s: float) -> None:
        self._until.pop(job_id, None)
        self._until[job_id] = time.monotonic() + ttl_s
        while len(self._until) > self._limit:
            del self._until[next(iter(self._until))]

    def discard(self, job_id: str) -> None:
        self._until.pop(job_id, None)

    def __contains__(self, job_id: object) -> bool:
        until = self._until.get(job_id) if isinstance(job_id, str) else None
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._until[job_id]  # type: ignore[arg-type]
        return False


class Producer:
    """Publishes requests for one deployment and answers them (sync) or marks them (jobs).

    ``reply_stream`` is the full name of the caller's private reply stream (a gateway's
    or an SDK client's); it is created on the first sync call. ``validate`` checks each
    request against its model before publishing (the gateway's early 400s); without it
    the worker's admission is the only check and its error comes back as the answer.
    ``cache_observer`` is told of response cache hits and misses (the gateway's metrics).
    ``default_version`` names the version that answers a request without one, for its
    cache key (a gateway's newest loaded version); without it the repository's folders
    are read (``plaza.response_cache.DefaultVersions``).
    """

    def __init__(
        self,
        settings: PlazaSettings,
        redis: aioredis.Redis,
        *,
        reply_stream: str,
        validate: bool = True,
        cache_observer: CacheObserver | None = None,
        default_version: Callable[[ModelSpec], str | None] | None = None,
    ) -> None:
        self.settings = settings
        self.names = settings.names
        self._validate = validate
        self._redis = redis
        self._publisher = RequestPublisher(settings.kafka, self.names)
        self.backlog = BacklogProbe(settings.kafka, self.names)
        self._guard = QueueGuard(self.backlog, self.names)
        self._store = ResultStore(redis, settings.redis, self.names)
        self._reply_stream = reply_stream
        self._mux: ReplyMux | None = None
        self._mux_lock = asyncio.Lock()
        self.inflight = InflightBytes(settings.producer.max_inflight_bytes)
        self._held: dict[str, dict[str, InferRequest]] = {}
        self._refused: dict[str, None] = {}
        """The models ``answer_held`` answered for: ``_hold`` asks ``refusal`` about them."""
        self.refusal: Callable[[str], PlazaError | None] | None = None
        """The error a new request of a model gets now (None: it is served), set by the
        gateway; asked only for the models of ``_refused``."""
        """The requests published that wait here for their answer (sync and streamed),
        by model, then id: ``answer_held`` answers them when their model is not served."""
        self._cancelling: set[asyncio.Task[None]] = set()
        self._marking: set[asyncio.Task[None]] = set()
        self._writing_marks: set[str] = set()
        """The jobs whose marker write is on its way (bounded by the writes in flight)."""
        self.unmarked = UnmarkedJobs()
        """Jobs published here whose marker Redis did not take (out of memory, no answer):
        ``PlazaClient.result`` waits for them as pending."""
        self.cache = ResponseCache(
            redis,
            settings.response_cache,
            self.names,
            default_version
            or DefaultVersions(settings.repository, config_name=settings.model_config_name),
            cache_observer,
            stats_ttl_s=settings.redis.stats_ttl_s,
        )

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Connect the Kafka producer and the backlog probe; start the cache's statistics."""
        await self._publisher.start()
        await self.backlog.start()
        self.cache.start()
        await warn_if_evicting(self._redis)

    async def stop(self) -> None:
        """Release what start() and the first sync call took; safe after a failed start.
        Each part gets ``producer.stop_timeout_s`` (a dead broker must not hang a stop)."""
        limit_s = self.settings.producer.stop_timeout_s
        if self._cancelling or self._marking:
            await asyncio.wait(self._cancelling | self._marking, timeout=limit_s)
        await self.cache.stop()
        if self._mux is not None:
            await self._mux.stop()
            self._mux = None
        for part in (self._publisher, self.backlog):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(part.stop(), limit_s)

    def topics_made(self, topics: list[str]) -> None:
        """The request topics its owner has made (a gateway makes its models' at start and
        as models load): requests to them are published without making them again."""
        self._publisher.topics_made(topics)

    def forget_topics(self, topics: set[str]) -> None:
        """Request topics of models no longer served: deleted, they are not made again
        (a later publish to one makes it again)."""
        self._publisher.forget_topics(topics)

    async def replies(self) -> ReplyMux:
        """The reply multiplexer, started on first use (clients that only submit jobs
        never create a reply stream)."""
        async with self._mux_lock:
            if self._mux is None:
                r = self.settings.redis
                mux = ReplyMux(
                    self._redis,
                    self._reply_stream,
                    ttl_s=r.reply_stream_ttl_s,
                    maxlen=r.stream_maxlen,
                )
                try:
                    await mux.start()
                except Exception as exc:
                    raise Unavailable(f"Redis did not answer: {exc}") from exc
                self._mux = mux
            return self._mux

    # -- producing -----------------------------------------------------------------------
    async def infer(
        self, req: InferRequest, spec: ModelSpec | None, timeout_s: float
    ) -> InferResult:
        """Publish ``req`` and wait up to ``timeout_s`` for its result (errors included).

        Unavailable when Kafka does not acknowledge it within ``kafka.request_timeout_ms``
        (the job is not marked); the ack is awaited that long even when ``timeout_s`` is
        shorter. After the ack, DeadlineExceeded with ``details["job_id"]`` when no answer
        has come within ``timeout_s`` (it may have passed while the ack was awaited): the
        job is marked and stays pollable under that id. A response cache hit
        is answered at once, unpublished. When the caller cancels the wait (a cancelled
        gRPC call), a ``cancelled`` answer is stored for the request, so that a worker that
        has not run it yet skips it. Unsupported for a decoupled model (``infer_stream``).
        """
        if spec is not None and spec.decoupled:
            raise Unsupported(
                f"model {spec.name!r} is decoupled (it may answer a request many times): "
                "stream its responses instead of waiting for one answer",
                model=spec.name,
            )
        ready = self._prepare(replace(req, reply=ReplyTo(stream=self._reply_stream)), spec)
        asked = time.monotonic()
        probe = await self.cache.probe(ready.req, spec, timeout_s)
        if probe is None:
            return await self._publish_and_await(ready, spec, timeout_s)
        return await self._answer_cached(ready, spec, probe, timeout_s, asked)

    async def _answer_cached(
        self,
        ready: _Prepared,
        spec: ModelSpec | None,
        probe: CacheProbe,
        timeout_s: float,
        started: float,
    ) -> InferResult:
        """A cached model's one answer (``infer``'s and ``infer_stream``'s): the hit, else
        the published request's answer, stored within what is left of the call's
        ``timeout_s`` from ``started``; the miss is counted whatever happens."""
        if probe.hit is not None:
            return probe.hit
        try:
            result = await self._publish_and_await(ready, spec, timeout_s, started)
        except BaseException:
            self.cache.missed(probe)
            raise
        await self.cache.store(probe, result, timeout_s - (time.monotonic() - started))
        return result

    async def _publish_and_await(
        self,
        ready: _Prepared,
        spec: ModelSpec | None,
        timeout_s: float,
        started: float | None = None,
    ) -> InferResult:
        """Publish and await the answer within ``timeout_s`` from ``started`` (the call's
        start, where a cache lookup came first; else now)."""
        mux = await self.replies()
        started = time.monotonic() if started is None else started
        await self._check_queue(spec, ready.level, timeout_s)
        with self.inflight.hold(request_bytes(ready.req)):
            fut = mux.expect(ready.req.id)  # before publishing: the reply may beat the ack
            try:
                self._hold(ready.req)
                # Kafka's own limit bounds the ack, not the caller's: a record it may still
                # take must end as a timeout with its job id, never as a retriable 503.
                await self._publisher.publish(ready.req, ready.topic)
                left = timeout_s - (time.monotonic() - started)
                return await self._await_reply(fut, ready, spec, left, timeout_s)
            except asyncio.CancelledError:
                self._cancel_later(ready.req)
                raise
            finally:
                mux.forget(ready.req.id)
                self._release(ready.req)

    async def infer_stream(
        self,
        req: InferRequest,
        spec: ModelSpec | None,
        timeout_s: float,
        *,
        limit: int = MAX_PENDING_RESPONSES,
    ) -> AsyncGenerator[InferResult, None]:
        """Publish ``req`` and yield each of its responses as it comes (errors included),
        until the final one: a decoupled model's many, or an ordinary model's one (looked
        up in the response cache and stored there as ``infer``'s, where the model enables
        it). The steps are ``infer``'s.

        ``timeout_s`` bounds each wait: for the first response from the publish, for each
        next one from the one before. When it passes, the job is marked (it stays pollable:
        ``poll`` returns all its responses once the final one is stored) and
        DeadlineExceeded is raised with ``details["job_id"]``. At most ``limit`` responses
        wait for the caller to take them; past it QueueFull ends the stream. A caller that
        stops before the final response (closes the generator, use
        ``contextlib.aclosing``, or is cancelled), or the QueueFull, stores a ``cancelled``
        answer for the request, as ``infer`` does.
        """
        ready = self._prepare(replace(req, reply=ReplyTo(stream=self._reply_stream)), spec)
        asked = time.monotonic()
        probe = await self.cache.probe(ready.req, spec, timeout_s)
        if probe is not None:  # a model that caches is never decoupled: one answer, infer's
            yield await self._answer_cached(ready, spec, probe, timeout_s, asked)
            return
        mux = await self.replies()
        started = time.monotonic()
        await self._check_queue(spec, ready.level, timeout_s)
        with self.inflight.hold(request_bytes(ready.req)):
            responses = mux.expect_responses(ready.req.id, limit)  # before publishing
            final = False
            try:
                self._hold(ready.req)
                await self._publisher.publish(ready.req, ready.topic)  # as in infer
                left = timeout_s - (time.monotonic() - started)
                while not final:
                    nxt = anext(responses)
                    result = await self._await_reply(nxt, ready, spec, left, timeout_s, "response")
                    final = result.final
                    yield result
                    left = timeout_s
            except (asyncio.CancelledError, GeneratorExit, QueueFull):
                if not final:
                    self._cancel_later(ready.req)
                raise
            finally:
                mux.forget(ready.req.id)
                self._release(ready.req)

    async def submit(
        self, req: InferRequest, spec: ModelSpec | None, view: JobView | None = None
    ) -> str:
        """Publish ``req`` as an async job (its result goes only to its result key) and
        mark it once Kafka has acknowledged it, with the ``view`` its answer is rendered
        in; returns the job id. A marker that Redis does not take fails nothing (``_mark``).
        The error of its model's refusal, unpublished, when ``answer_held`` answered for the
        model while this job was on its way here (as ``_hold`` refuses a sync request)."""
        ready = self._prepare(replace(req, reply=ReplyTo()), spec)
        await self._check_queue(spec, ready.level)
        error = self._refused_error(ready.req.model)  # refused while it was on its way here
        if error is not None:
            raise error
        with self.inflight.hold(request_bytes(ready.req)):
            await self._publisher.publish(ready.req, ready.topic)
        await self._mark(ready, spec, view)
        return ready.req.id

    async def publish_many(
        self, requests: Iterable[tuple[InferRequest, ModelSpec | None]]
    ) -> list[str]:
        """Publish many (request, its model's spec) pairs as they are (their reply target
        included), letting the Kafka producer batch them; waits for every ack. No job
        markers: pipelines read results from the streams they name.

        Everything that can be checked is checked before the first request is sent, and
        fails the call with nothing of it published: each request (validated, encoded
        within ``kafka.max_request_bytes``, its input bytes within the in-flight budget),
        and each model's queue, which must have room for all of the batch's requests of
        a level (QueueFull with ``details["depth"]``, ``["batch"]`` and
        ``["max_queue_size"]`` otherwise). When the next request would pass the byte budget,
        the ones sent so far are acknowledged first, freeing their bytes: a long pipeline
        waits, it is not refused. A failure after the first send (Kafka did not take or
        acknowledge a record, or other calls hold the byte budget) is raised once every
        record sent has been acknowledged or has timed out, with
        ``details["published_ids"]``: those Kafka acknowledged, which will run. The
        others may still arrive; send them again as they are (same correlation ids).
        """
        batch = [self._prepare_batched(req, spec) for req, spec in requests]
        await self._check_batch_queues(batch)
        sends = _Sends()
        try:
            await self._send_batch(batch, sends)
        except PlazaError as exc:
            if not sends.ids:
                raise
            with contextlib.suppress(PlazaError):  # the failure raised below says it
                await self._publisher.acknowledged(sends.take_unawaited())
            raise sends.partly_published(exc, len(batch)) from exc
        return sends.ids

    def _prepare_batched(self, req: InferRequest, spec: ModelSpec | None) -> _Prepared:
        """``_prepare``, and what a send would refuse: a request that does not encode or
        is over ``kafka.max_request_bytes``, one whose input bytes no budget could hold."""
        ready = self._prepare(req, spec)
        self._publisher.encode(ready.req)  # encoded again, stamped, when it is sent
        nbytes = request_bytes(ready.req)
        if nbytes > self.inflight.limit:
            raise PayloadTooLarge(
                f"request {req.id} has {nbytes} bytes of inputs; the in-flight limit is "
                f"{self.inflight.limit} (producer.max_inflight_bytes)",
                model=req.model,
                size=nbytes,
            )
        return ready

    async def _check_batch_queues(self, batch: list[_Prepared]) -> None:
        """QueueFull, before anything is sent, when a level's queue has no room for the
        batch's requests to it (the queue guard's check, counting the batch itself)."""
        counts: Counter[tuple[str, int]] = Counter()
        specs: dict[str, ModelSpec] = {}
        for ready in batch:
            if ready.spec is not None:
                counts[ready.spec.name, ready.level] += 1
                specs[ready.spec.name] = ready.spec
        for (model, level), count in counts.items():
            await self._check_queue(specs[model], level, adding=count)

    async def _send_batch(self, batch: list[_Prepared], sends: _Sends) -> None:
        """Send every request of ``batch`` and await their acks, within the byte budget."""
        with contextlib.ExitStack() as held:
            for ready in batch:
                nbytes = request_bytes(ready.req)
                if sends.unawaited and not self.inflight.fits(nbytes):
                    await self._publisher.acknowledged(sends.take_unawaited())
                    held.close()  # frees their bytes; the stack is empty and reusable
                held.enter_context(self.inflight.hold(nbytes))
                sends.add(ready.req.id, await self._publisher.send(ready.req, ready.topic))
            await self._publisher.acknowledged(sends.take_unawaited())

    async def poll(self, job_id: str, timeout_s: float = POLL_TIMEOUT_S) -> JobStatus:
        """pending, done (with the result) or unknown; Unavailable when Redis is away (or
        has not answered within ``timeout_s``), and an internal error (not retriable:
        polling again reads the same bytes) when what is stored for the job does not
        decode. A pending job of a model refused here (as ``answer_held`` answers a waiting
        request's) is answered with the refusal's error first, so it polls as done with it
        (``_answer_refused_job``). A job whose marker is still being written here (past a
        sync call's deadline, ``_mark_later``) polls as pending, not unknown."""
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                status = await self._store.poll(job_id)
                if status.state == "pending" and self._refused:
                    status = await self._answer_refused_job(job_id) or status
        except CodecError as exc:
            raise PlazaError(
                f"the stored result of job {job_id} does not decode: {exc}", job_id=job_id
            ) from exc
        except PlazaError:
            raise
        except TimeoutError as exc:
            raise Unavailable(f"Redis did not answer in {timeout_s:.3g} s") from exc
        except Exception as exc:
            raise Unavailable(redis_failure(exc)) from exc
        if status.state == "unknown" and job_id in self._writing_marks:
            return JobStatus("pending")
        return status

    # -- the steps -----------------------------------------------------------------------
    def _prepare(self, req: InferRequest, spec: ModelSpec | None) -> _Prepared:
        """Validate, settle the priority level, choose the topic.

        Without a spec (an SDK client that cannot read the repository) the request goes to
        the model's base topic with its priority as given: the worker settles it there. So
        does an ensemble's: its runner hands that priority to each step's request.
        """
        if spec is None:
            settle_level(req.priority, 0, 0)  # a negative priority is refused even so
            return _Prepared(req, self.names.request_topic(req.model), 0)
        if self._validate:
            validate_request(req, spec)
        if spec.is_ensemble:
            # Triton hands the request's priority to every step as it is: the runner's
            # step requests settle it against each step model's levels. One topic.
            settle_level(req.priority, 0, 0)  # a negative priority is refused even so
            return _Prepared(req, self.names.request_topic(req.model), 0, spec)
        batching = spec.batching
        level = settle_level(
            req.priority, batching.priority_levels, batching.default_priority_level
        )
        settled = req if level == req.priority else replace(req, priority=level)
        return _Prepared(settled, self.names.request_topic(req.model, level), level, spec)

    async def _check_queue(
        self,
        spec: ModelSpec | None,
        level: int,
        timeout_s: float | None = None,
        *,
        adding: int = 1,
    ) -> None:
        """QueueFull at once when the level's queue is at max_queue_size (with ``adding``
        requests more: when it has no room for them all). The check is part of a sync
        call's time (``timeout_s``): when that runs out first, DeadlineExceeded with no job
        (nothing was published, so a retry is safe); Unavailable when Kafka does not answer
        it within its own request timeout."""
        if spec is None:
            return
        limit_s = self.settings.kafka.request_timeout_ms / 1000
        caller_first = timeout_s is not None and timeout_s < limit_s
        try:
            async with asyncio.timeout(timeout_s if caller_first else limit_s):
                if adding == 1:
                    await self._guard.check(spec, level)
                else:
                    await self._check_room(spec, level, adding)
        except PlazaError:
            raise
        except TimeoutError as exc:
            if caller_first:
                raise DeadlineExceeded(
                    f"the call's {max(timeout_s or 0.0, 0.0):g} s ran out during the backlog "
                    "check (Kafka had not answered it); nothing was published"
                ) from exc
            raise Unavailable(
                f"Kafka did not answer the backlog check within {limit_s:g} s"
            ) from exc
        except Exception as exc:
            raise Unavailable(f"Kafka did not answer the backlog check: {exc}") from exc

    async def _check_room(self, spec: ModelSpec, level: int, adding: int) -> None:
        """QueueFull when ``level``'s queue cannot take ``adding`` requests more without
        passing max_queue_size (the guard's check, for a batch of them)."""
        limit = spec.batching.queue_policy(level).max_queue_size
        if not limit:
            return
        depth = await self.backlog.lag(spec.name, self.names.request_topic(spec.name, level))
        if depth + adding > limit:
            raise QueueFull(
                f"model {spec.name!r} queue (priority level {level or 'default'}) holds "
                f"{depth} requests and the batch has {adding} for it; max_queue_size is "
                f"{limit}: publish at most {max(limit - depth, 0)} of them now, in "
                "smaller batches",
                depth=depth,
                batch=adding,
                max_queue_size=limit,
            )

    async def _await_reply(
        self,
        reply: Awaitable[InferResult],
        ready: _Prepared,
        spec: ModelSpec | None,
        left_s: float,
        timeout_s: float,
        what: str = "result",
    ) -> InferResult:
        """``reply`` (a request's answer, or its stream's next response) within ``left_s``;
        past it the job is marked and DeadlineExceeded names it, to be polled."""
        try:
            async with asyncio.timeout(max(left_s, 0.0)):
                return await reply
        except TimeoutError:
            pass
        self._mark_later(ready, spec)  # published and acknowledged: the job is real
        raise DeadlineExceeded(
            f"no {what} within {timeout_s:g} s; poll job {ready.req.id} for it",
            job_id=ready.req.id,
        )

    def _hold(self, req: InferRequest) -> None:
        """Hold ``req`` while it waits for its answer (``answer_held``); the error of its
        model's refusal instead, when ``answer_held`` answered its model's requests while
        this one was on its way here (a cache lookup, a backlog probe) and the model is
        still not served (``refusal``)."""
        error = self._refused_error(req.model)
        if error is not None:
            raise error
        self._held.setdefault(req.model, {})[req.id] = req

    def _refused_error(self, model: str) -> PlazaError | None:
        """The error of ``model``'s refusal while ``answer_held`` has answered for it and it
        is still not served (``refusal``); None otherwise (served again: forgotten)."""
        if model not in self._refused:
            return None
        error = self.refusal(model) if self.refusal is not None else None
        if error is None:
            del self._refused[model]  # served again
        return error

    def _release(self, req: InferRequest) -> None:
        held = self._held.get(req.model)
        if held is not None:
            held.pop(req.id, None)
            if not held:
                del self._held[req.model]

    async def answer_held(
        self, model: str, error: PlazaError, skip: frozenset[str] = frozenset()
    ) -> list[str]:
        """Answer with ``error`` the requests of ``model`` that wait here for their answer
        (but those in ``skip``), as a worker answers: the answer stored under each result
        key (first write wins: one a worker stored stands, and a worker that fetches one
        of them later skips it, ``workers/answered.py``), then sent on the reply stream,
        where their callers get it. For a model no worker will ever answer (the gateway's
        registry says when). Returns the ids of the requests answered."""
        self._refused[model] = None  # the requests still on their way are refused too
        chosen = [r for i, r in self._held.get(model, {}).items() if i not in skip]
        if not chosen:
            return []
        info = ErrorInfo(error.code, error.message)
        stored = await self._store_answers(
            [InferResult(r.id, r.model, r.version, error=info) for r in chosen]
        )
        if stored:
            await self._send_answers(stored)
        return [r.id for r in chosen]

    async def _answer_refused_job(self, job_id: str) -> JobStatus | None:
        """A pending job of a model ``answer_held`` answered for and still refused (its
        marker names the model): its answer is the refusal's error, stored as a waiting
        request's is (first write wins, and a worker that fetches the job later skips it);
        then the job as it polls now. None for a job of any other model. Jobs are answered
        when polled, so that any gateway's job is, whoever submitted it."""
        model = marker_model(await self._redis.get(self.names.job_key(job_id)))
        error = None if model is None else self._refused_error(model)
        if model is None or error is None:
            return None
        info = ErrorInfo(error.code, error.message)
        await self._store_answers([InferResult(job_id, model, "", error=info)])
        return await self._store.poll(job_id)

    async def _store_answers(self, results: list[InferResult]) -> list[bytes]:
        """Store ``results`` under their result keys unless one is stored there already
        (first write wins, as a worker's); returns the encoded ones stored."""
        payloads = [encode_result(result) for result in results]
        pipe = self._redis.pipeline(transaction=False)
        for result, payload in zip(results, payloads, strict=True):
            key = self.names.result_key(result.id)
            pipe.set(key, payload, nx=True, ex=self.settings.redis.result_ttl_s)
        return [p for p, won in zip(payloads, await pipe.execute(), strict=True) if won]

    async def _send_answers(self, payloads: list[bytes]) -> None:
        """Add the encoded results ``payloads`` to this producer's reply stream, in one
        entry, as a worker adds a batch's (``workers/writer.py``)."""
        r = self.settings.redis
        entry = {
            STREAM_FIELD_COUNT: str(len(payloads)).encode(),
            STREAM_FIELD_RESULTS: join_results(payloads),
        }
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(self._reply_stream, entry, maxlen=r.stream_maxlen, approximate=True)  # type: ignore[arg-type]
        pipe.expire(self._reply_stream, r.reply_stream_ttl_s)
        await pipe.execute()

    def _cancel_later(self, req: InferRequest) -> None:
        """Store the cancelled answer on a task of its own: the cancelled caller's task
        must not wait for Redis. A failure only costs the skip (the worker runs it)."""
        task = asyncio.get_running_loop().create_task(self._store_cancel(req))
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)

    async def _store_cancel(self, req: InferRequest) -> None:
        try:
            await self._store.cancel(req)
        except Exception as exc:
            log.warning("could not mark %s cancelled (a worker will still run it): %s", req.id, exc)

    def _mark_later(self, ready: _Prepared, spec: ModelSpec | None) -> None:
        """Write the job's marker on a task of its own: the caller's deadline has passed
        and must not wait for Redis too. Until it is written the job polls as pending
        (``poll``); with ``MAX_MARKING`` writes in flight it is not written at all."""
        if len(self._marking) >= MAX_MARKING:
            ttl_s = job_marker_ttl_s(ready.req, spec, ready.level, self.settings)
            self.unmarked.add(ready.req.id, ttl_s)
            log.warning(
                "job %s: %d marker writes in flight already; not marked (it polls as "
                "unknown until its result is stored)",
                ready.req.id,
                len(self._marking),
            )
            return
        self._writing_marks.add(ready.req.id)  # pending from now, not once the task runs
        task = asyncio.get_running_loop().create_task(self._mark(ready, spec))
        self._marking.add(task)
        task.add_done_callback(self._marking.discard)

    async def _mark(
        self, ready: _Prepared, spec: ModelSpec | None, view: JobView | None = None
    ) -> None:
        """Write the job's marker. Kafka holds the job already (it will run): a marker
        write that fails must not make the caller retry it (a 503 would run it twice), so
        it is logged and the job answered as usual; its result key alone then answers a
        poll once it is stored (unknown until then, rendered without ``view``). The write
        waits ``MARK_TIMEOUT_S`` at most: a Redis that hangs does not hold the caller."""
        ttl_s = job_marker_ttl_s(ready.req, spec, ready.level, self.settings)
        self._writing_marks.add(ready.req.id)
        try:
            async with asyncio.timeout(MARK_TIMEOUT_S):
                await self._store.mark_submitted(
                    ready.req.id,
                    ready.req.model,
                    ttl_s=ttl_s,
                    decoupled=None if spec is None else spec.decoupled,
                    view=view,
                )
        except Exception as exc:  # TimeoutError included
            self.unmarked.add(ready.req.id, ttl_s)
            reason = (
                f"Redis did not answer in {MARK_TIMEOUT_S:g} s"
                if isinstance(exc, TimeoutError)
                else redis_failure(exc)
            )
            log.warning(
                "job %s was published but its marker was not written (%s): it polls as "
                "unknown until its result is stored (PlazaClient.result of the client that "
                "submitted it waits for it as pending)",
                ready.req.id,
                reason,
            )
        finally:
            self._writing_marks.discard(ready.req.id)


def marker_model(marker: bytes | str | None) -> str | None:
    """The model a job marker names (``plaza.results.marker_value``: its first word); None
    for no marker."""
    if marker is None:
        return None
    text = marker.decode(errors="replace") if isinstance(marker, bytes) else marker
    return text.split(" ", 1)[0]


def job_marker_ttl_s(
    req: InferRequest, spec: ModelSpec | None, level: int, settings: PlazaSettings
) -> int:
    """How long a job marker lives: as long as the job may wait in Kafka, plus the result
    TTL, so that a queued job polls as pending (never unknown) until its result is stored.

    The wait is bounded by the request's deadline when the model answers expired requests
    with a timeout (timeout_action REJECT, Triton's default, assumed without a spec), and
    by ``producer.max_queued_s`` otherwise. The queue-policy timeout does not bound it: it
    starts only when a worker takes the request in.
    """
    queued_s = float(settings.producer.max_queued_s)
    rejects = spec is None or spec.batching.queue_policy(level).reject_on_timeout
    if rejects and req.deadline_ms is not None:
        left_s = (req.deadline_ms - time.time() * 1000) / 1000
        queued_s = min(queued_s, max(left_s, 0.0) + DEADLINE_GRACE_S)
    return math.ceil(queued_s) + settings.redis.result_ttl_s
