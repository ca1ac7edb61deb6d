"""The gateway's service: its model registry, health and statistics, with no HTTP types.

The HTTP front (``gateway/app.py``) and a gRPC front call the same methods. Producing
(validate, settle the priority, queue guard, publish, await the reply or mark the job) is
``plaza.producer.Producer``'s, shared with the SDK; this module only looks up the model and
hands the request over. Errors are PlazaErrors; only ``gateway/errors.py`` turns them into
statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient
from redis.exceptions import RedisClusterException, RedisError

from plaza.connections import ensure_topics, kafka_admin, redis_client
from plaza.contract import InferRequest, InferResult
from plaza.errors import InvalidInput, JobNotFound, ModelNotFound, PlazaError, Unavailable
from plaza.gateway.metrics import GatewayMetrics, metered, metered_stream
from plaza.gateway.registry import FOLLOW_INTERVAL_S, IndexEntry, ModelRegistry
from plaza.gateway.shared_memory import SharedMemoryRegions, input_limit
from plaza.gateway.statistics import read_statistics
from plaza.gateway.tracing import Tracer, failure_code
from plaza.log_settings import LogFollower, LogSettings
from plaza.model_control import LoadedModel, live_workers, serving_models
from plaza.modelconfig import ModelSpec
from plaza.naming import folder_version
from plaza.producer import Producer
from plaza.results import JobStatus, JobView, raise_for_error
from plaza.settings import PlazaSettings
from plaza.single_flight import SingleFlight
from plaza.tasks import cancel_and_wait

log = logging.getLogger(__name__)

KAFKA_CHECK_TTL_S = 1.0
"""How long a Kafka health answer is reused (readiness probes come often)."""
CHECK_TIMEOUT_S = 2.0
"""A health check that takes longer than this counts as failed."""
MAX_VERSION = 2**63 - 1
"""The largest version Triton parses (a 64-bit ``std::stol``); past it, as a malformed one,
INVALID_ARG."""

T = TypeVar("T")


def check_version(version: str, model: str) -> None:
    """InvalidInput unless ``version`` is a non-negative integer in ASCII digits: Triton's
    INVALID_ARG for ``abc`` or ``-1`` (and here for ``1.5``, whose leading digits Triton's
    ``std::stol`` would take). ``0`` and ``01`` are integers, so a version not loaded:
    ModelNotFound, as Triton's NOT_FOUND."""
    significant = version.lstrip("0")
    if not (version.isascii() and version.isdigit()) or (
        len(significant) > len(str(MAX_VERSION)) or int(significant or "0") > MAX_VERSION
    ):
        raise InvalidInput(
            f"invalid model version {version!r}: a version should be an integral value > 0",
            model=model,
        )


@dataclass(frozen=True, slots=True)
class Readiness:
    """The answer of a readiness check; ``reasons`` says what is missing when not ready."""

    ready: bool
    reasons: tuple[str, ...] = ()


@dataclass(slots=True)
class _StreamTrace:
    """A traced stream's stamps, taken from its responses as they pass the gateway."""

    start_ns: int
    version: str = ""
    worker_ns: dict[str, int] = field(default_factory=dict)
    """The worker's stages, from the first response that carries them."""
    first_ns: int = 0
    """When its first response with data (or an error) passed: INFER_RESPONSE_COMPLETE."""

    def saw(self, result: InferResult) -> None:
        self.version = result.version or self.version
        if not self.worker_ns and result.trace_ns:
            self.worker_ns = dict(result.trace_ns)
        if not self.first_ns and not result.empty:
            self.first_ns = time.time_ns()

    def stages(self) -> dict[str, int]:
        """The worker's stages and the first response's."""
        if not self.first_ns:
            return dict(self.worker_ns)
        return {**self.worker_ns, "INFER_RESPONSE_COMPLETE": self.first_ns}


class _CachedCheck:
    """Remembers the last (ok, reason) of a check for ``ttl_s`` seconds (monotonic)."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._at = -float("inf")
        self._value: tuple[bool, str] = (False, "not checked yet")

    def fresh(self) -> tuple[bool, str] | None:
        return self._value if time.monotonic() - self._at < self._ttl_s else None

    def store(self, ok: bool, reason: str) -> None:
        self._at, self._value = time.monotonic(), (ok, reason)


class GatewayService:
    """Everything the gateway does, for one deployment (its settings and prefixes)."""

    def __init__(self, settings: PlazaSettings) -> None:
        self.settings = settings
        self.names = settings.names
        self.gateway_id = settings.gateway.gateway_id or uuid.uuid4().hex
        self.registry = ModelRegistry(settings)
        self.registry.on_refused = self._refused
        self._tasks: list[asyncio.Task[None]] = []
        self._answering: set[asyncio.Task[None]] = set()
        """Tasks answering the waiting requests of a model no worker will serve."""
        self._refused_at_start: set[str] = set()
        """Models refused before the producer started (the registry's first follow):
        answered for once it has (``_refused``), so that their jobs poll as refused."""
        self._redis: aioredis.Redis | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: Producer | None = None
        self._kafka_check = _CachedCheck(KAFKA_CHECK_TTL_S)
        self._kafka_checks: SingleFlight[None, tuple[bool, str]] = SingleFlight()
        self.metrics = GatewayMetrics()
        self.log_settings = LogFollower(LogSettings.from_level(settings.log_level))
        """Triton's logging extension (``plaza.log_settings``): the deployment's settings."""
        self._log_lock = asyncio.Lock()
        """Held while this gateway reads or changes the stored log settings."""
        gw = settings.gateway
        # Shared memory regions and trace settings live in one process: with several
        # gateway processes a client's next call may reach another, so both are refused.
        # gateway.workers is the deployment's count in each of its processes as well
        # (gateway/main.py, process_settings).
        several = (
            f"gateway.workers is {gw.workers}: each process would hold its own"
            if gw.workers > 1
            else ""
        )
        self.tracer = Tracer(gw.trace_dir, refusal=several and f"trace settings: {several}")
        self.shm = SharedMemoryRegions(
            allowed=gw.allow_client_shm,
            max_regions=gw.max_shm_regions,
            max_input_bytes=input_limit(settings),
            refusal=several and f"client shared memory needs one gateway process ({several})",
        )

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def models(self) -> dict[str, LoadedModel]:
        """The models served now (``registry``)."""
        return self.registry.models

    @property
    def failed(self) -> dict[str, str]:
        """Models that could not be read, with the reason."""
        return self.registry.failed

    async def start(self) -> None:
        """Read the repository, create the request topics, connect Kafka and Redis; in
        modes explicit and poll, follow the model table (and poll the repository)."""
        self.load_repository()
        topics = self._request_topics()
        await ensure_topics(self.settings.kafka, topics)
        self._redis = redis_client(self.settings.redis)
        await self.registry.start(self._redis)
        if self.registry.mode != "none":
            self._tasks.append(asyncio.create_task(self._every(FOLLOW_INTERVAL_S, self._follow)))
        self._tasks.append(asyncio.create_task(self._every(FOLLOW_INTERVAL_S, self._follow_log)))
        if self.registry.mode == "poll":
            poll_s = self.settings.gateway.repository_poll_s
            self._tasks.append(asyncio.create_task(self._every(poll_s, self.registry.poll)))
        self._producer = Producer(
            self.settings,
            self._redis,
            reply_stream=self.names.reply_stream(self.gateway_id),
            cache_observer=self.metrics,
            default_version=self._default_version,
        )
        self._producer.refusal = self._refusal
        for name in sorted(self._refused_at_start):
            self._refused(name)
        self._refused_at_start.clear()
        await self._producer.start()
        self._producer.topics_made(topics)
        await self._producer.replies()  # the reply stream exists before the first call
        self._admin = kafka_admin(self.settings.kafka)
        await self._admin.start()

    async def stop(self) -> None:
        """Release everything start() took; safe to call after a failed start."""
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        await cancel_and_wait(list(self._answering))
        await self._kafka_checks.close()
        if self._producer is not None:
            await self._producer.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
        if self._redis is not None:
            await self._redis.aclose()
        self._producer = self._admin = self._redis = None
        self.shm.close()
        self.tracer.flush()  # on the loop, as every flush: then wait for the writer
        await asyncio.to_thread(self.tracer.close)

    def load_repository(self) -> None:
        """Read the models served from the start (``ModelRegistry.read_start_models``)."""
        self.registry.read_start_models()

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` every ``interval_s`` until cancelled; a failed step is logged."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await step()
            except Exception as exc:  # Redis restarting: the next round tries again
                log.warning("gateway: %s failed: %s", getattr(step, "__name__", step), exc)

    async def _follow(self) -> None:
        before = set(self.models)
        served = self._request_topics()
        await self.registry.follow()
        self._forget_topics(served)
        if set(self.models) - before:
            topics = self._request_topics()
            await ensure_topics(self.settings.kafka, topics)
            self._require(self._producer).topics_made(topics)

    def _forget_topics(self, served: list[str]) -> None:
        """Of ``served`` (the request topics before a change), those of models no longer
        served: this gateway's publisher stops making them again when they are deleted
        (an operator retiring an unloaded model's topics)."""
        gone = set(served).difference(self._request_topics())
        if gone and self._producer is not None:
            self._producer.forget_topics(gone)

    def _refused(self, name: str) -> None:
        """``name`` is no longer served: the hosts refused its load and no worker of it
        lives (``ModelRegistry.on_refused``). The requests of it that wait here get at
        once the error a new request gets, instead of waiting out their time, and so do
        its jobs when polled (``Producer.poll``), whichever gateway submitted them."""
        if self._producer is None:
            self._refused_at_start.add(name)  # a gateway started after the refusal
            return
        task = asyncio.get_running_loop().create_task(self._answer_refused(name))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    def _refusal(self, name: str) -> PlazaError | None:
        """The error a new request of ``name`` gets now; None while it is served."""
        try:
            self.model(name)
        except ModelNotFound as exc:
            return exc
        return None

    async def _answer_refused(self, name: str) -> None:
        """Answer the requests of ``name`` that wait here (``Producer.answer_held``) while
        it is not served; again for those that came past the model's lookup meanwhile."""
        answered: frozenset[str] = frozenset()
        while True:
            try:
                self.model(name)
            except ModelNotFound as exc:
                error = exc
            else:
                return  # served again (a new load): its requests wait for its workers
            try:
                more = await self._require(self._producer).answer_held(name, error, answered)
            except (RedisError, RedisClusterException, OSError) as exc:
                log.warning("model %s: its waiting requests wait out their time: %s", name, exc)
                return
            if not more:
                return
            log.info("model %s: %d waiting requests answered: %s", name, len(more), error)
            answered |= set(more)

    def _request_topics(self) -> list[str]:
        topics = {
            topic
            for model in self.models.values()
            for topic in self.names.request_topics(
                model.spec.name, model.spec.batching.priority_levels
            )
        }
        return sorted(topics)

    # -- models --------------------------------------------------------------------------
    def model(self, name: str, version: str = "") -> LoadedModel:
        """The loaded model (and version, "" for its default); ModelNotFound otherwise.

        A version is named as its folder is (``plaza.naming.folder_version``: ``1``, not
        ``01``), so that one version has one name in the labels, statistics and cache keys
        that the request's version string goes on to. A version that is no integer at all
        is InvalidInput, as Triton's (before the model is looked up)."""
        if version:
            check_version(version, name)
        model = self.models.get(name)
        if model is None:
            reason = self.failed.get(name)
            detail = f" (failed to load: {reason})" if reason else ""
            raise ModelNotFound(f"model {name!r} is not loaded{detail}", model=name)
        if version and folder_version(version) not in model.versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r} loaded", model=name)
        return model

    def _default_version(self, spec: ModelSpec) -> str | None:
        """The version that answers a request without one: the newest its load serves (as
        the workers resolve ""), not the newest folder, which may be staged but not loaded.
        The response cache keys such a request by it; None while the model is not loaded."""
        model = self.models.get(spec.name)
        return str(max(model.versions)) if model is not None and model.versions else None

    def model_metadata(self, name: str, version: str = "") -> LoadedModel:
        """What the metadata endpoint describes (rendered by ``plaza.gateway.kserve``)."""
        return self.model(name, version)

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """Triton's JSON form of the model's config.pbtxt."""
        return self.model(name, version).spec.config_json()

    async def model_ready(self, name: str, version: str = "") -> bool:
        """The model is loaded and at least one of its workers is alive (an ensemble: a
        runner, and a worker of each step's model)."""
        try:
            self.model(name, version)
        except ModelNotFound:
            return False
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                counts = await self._live_workers([name])
        except Exception:
            return False
        return counts[0] >= 1

    # -- model control -----------------------------------------------------------------
    async def load_model(self, name: str, config: str = "") -> LoadedModel:
        """Triton's load: serve ``name`` (optionally with a config override in Triton's JSON
        form) and wait until a worker serves it. Requests that come meanwhile are accepted
        and wait in Kafka. Unavailable when no worker comes within gateway.load_timeout_s
        (the model stays loaded; it turns READY when one comes). The steps are
        ``plaza.model_control.ModelControl.load``'s, which a Python model's
        ``pb_utils.load_model`` runs too."""
        return await self.registry.load(name, config, wait=True)

    async def unload_model(self, name: str, dependents: bool = False) -> None:
        """Triton's unload: stop accepting requests for ``name`` (and, with ``dependents``,
        for the ensembles that call it); their workers answer what is already queued, then
        stop (whoever runs them watches the model table)."""
        served = self._request_topics()
        try:
            await self.registry.unload(name, dependents)
        finally:
            self._forget_topics(served)

    async def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Triton's repository index: every model of the repository, with its state."""
        served = list(self.models)
        counts = await self._live_workers(served) if served else []
        return self.registry.index(dict(zip(served, counts, strict=True)), ready_only)

    async def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of every model, one model or one version (``gateway.statistics``)."""
        chosen = {name: self.model(name, version)} if name else self.models
        return await read_statistics(self._require(self._redis), self.names, chosen, version)

    # -- inference -----------------------------------------------------------------------
    def sync_timeout(self, timeout_us: int | None) -> float:
        """Seconds a sync call waits: the configured wait, shortened by a request timeout
        (None or 0, Triton's default, is no timeout)."""
        configured = self.settings.gateway.sync_timeout_s
        return min(configured, timeout_us / 1e6) if timeout_us else configured

    @metered
    async def infer(self, req: InferRequest, timeout_s: float | None = None) -> InferResult:
        """Publish ``req`` and wait for its result (``plaza.producer.Producer.infer``).

        Unavailable when Kafka does not take it; on timeout DeadlineExceeded with
        ``details["job_id"]``: the job stays pollable under that id. A result that carries
        an error is raised as that error.
        """
        spec = self.model(req.model, req.version).spec
        wait_s = self.settings.gateway.sync_timeout_s if timeout_s is None else timeout_s
        traced = self.tracer.sample(req.model)  # Triton's trace extension (gateway/tracing.py)
        started_ns = time.time_ns() if traced else 0
        if traced:
            req = msgspec.structs.replace(req, trace=True)
        result: InferResult | None = None
        failure = ""
        try:
            result = await self._require(self._producer).infer(req, spec, wait_s)
        except BaseException as exc:
            failure = failure_code(exc)
            raise
        finally:
            if traced:  # failed or not: a counted request always yields its trace
                self.tracer.record(
                    req.model,
                    result.version if result is not None else req.version,
                    req.id,
                    started_ns,
                    time.time_ns(),
                    result.trace_ns if result is not None else {},
                    trace_file=traced,  # the file set when it came (it may change meanwhile)
                    error=failure or (result.error.code if result and result.error else ""),
                )
        return raise_for_error(result)

    @metered_stream
    async def infer_stream(
        self, req: InferRequest, timeout_s: float | None = None
    ) -> AsyncGenerator[InferResult, None]:
        """Publish ``req`` and yield each of its responses as it comes, until the final one
        (``plaza.producer.Producer.infer_stream``): a decoupled model's many, an ordinary
        model's one. Responses that carry an error are yielded, not raised: a front decides
        whether one ends its stream. ``timeout_s`` (default ``gateway.sync_timeout_s``)
        bounds the wait for each response; past it DeadlineExceeded with
        ``details["job_id"]``. A sampled request is traced as ``infer``'s are, with
        INFER_RESPONSE_COMPLETE at its first response (as Triton's stream does) and
        REQUEST_END at its final one; a stream that fails or is left before its final
        response is traced when it ends, with its failure (``Tracer.record``'s ``error``)."""
        spec = self.model(req.model, req.version).spec
        wait_s = self.settings.gateway.sync_timeout_s if timeout_s is None else timeout_s
        traced = self.tracer.sample(req.model)
        if traced:
            req = msgspec.structs.replace(req, trace=True)
        trace = _StreamTrace(time.time_ns()) if traced else None
        responses = self._require(self._producer).infer_stream(req, spec, wait_s)
        failure = "incomplete"  # what a stream that ends before its final response is
        try:
            async with contextlib.aclosing(responses):
                async for result in responses:
                    if trace is not None:
                        trace.saw(result)
                        if result.final:
                            error = result.error.code if result.error else ""
                            self._trace_stream(req, trace, traced, error)
                            trace = None
                    yield result
        except BaseException as exc:
            failure = failure_code(exc)
            raise
        finally:
            if trace is not None:  # failed or left: a counted request always yields its trace
                self._trace_stream(req, trace, traced, failure)

    def _trace_stream(self, req: InferRequest, trace: _StreamTrace, file: str, error: str) -> None:
        """Record a traced stream's trace, ending now, in ``file`` (``Tracer.sample``'s)."""
        stages = trace.stages()
        version = trace.version or req.version
        end_ns = time.time_ns()
        self.tracer.record(
            req.model, version, req.id, trace.start_ns, end_ns, stages, file, error=error
        )

    def decoupled(self, result: InferResult, marked: bool | None = None) -> bool:
        """Whether ``result`` is a decoupled model's answer: as its job's marker says
        (``marked``, ``JobStatus.decoupled``) where it says; else as the model's config
        says while it is loaded; past that, a result that is not a request's first, or an
        empty one, tells."""
        if marked is not None:
            return marked
        model = self.models.get(result.model)
        if model is not None:
            return model.spec.decoupled
        return result.index > 0 or result.empty

    async def submit(self, req: InferRequest, view: JobView | None = None) -> str:
        """Publish ``req`` as an async job; the result goes only to its result key (a
        decoupled model's responses before its final one to their response keys), and a
        poll renders it as ``view`` says (the client's ``id``, its binary choices)."""
        spec = self.model(req.model, req.version).spec
        return await self._require(self._producer).submit(req, spec, view)

    async def poll(self, job_id: str) -> JobStatus:
        """pending or done (with the final result and every response,
        ``plaza.results.JobStatus``); JobNotFound for an id never submitted."""
        status = await self._require(self._producer).poll(job_id)
        if status.state == "unknown":
            raise JobNotFound(f"no job {job_id!r} (never submitted, or expired)", job_id=job_id)
        return status

    # -- log settings (Triton's logging extension) ------------------------------------------
    async def _follow_log(self) -> None:
        redis = self._require(self._redis)
        # Not beside a change: a read begun before it would apply the old settings after it.
        async with self._log_lock:
            await self.log_settings.follow_stored(redis, self.names.log_settings_key())

    async def get_log_settings(self) -> LogSettings:
        """This process's log settings: its own start settings and the stored changes made
        since it started (``plaza.log_settings``)."""
        await self._follow_log()
        return self.log_settings.current

    async def update_log_settings(self, changes: Mapping[str, Any]) -> LogSettings:
        """Change the settings ``changes`` names, for the whole deployment: stored in Redis
        (every process applies them on its next beat) and applied here at once. One change
        at a time here, and a compare-and-set across gateway processes
        (``LogFollower.change_stored``): concurrent changes all land."""
        redis = self._require(self._redis)
        async with self._log_lock:
            try:
                return await self.log_settings.change_stored(
                    redis, self.names.log_settings_key(), changes
                )
            except (RedisError, RedisClusterException, OSError) as exc:
                raise Unavailable(f"Redis did not take the log settings: {exc}") from exc

    @property
    def producer(self) -> Producer:
        """The producer core this gateway publishes through (Unavailable before start)."""
        return self._require(self._producer)

    @staticmethod
    def _require(part: T | None) -> T:
        if part is None:
            raise Unavailable("the gateway is not started")
        return part

    # -- health --------------------------------------------------------------------------
    def live(self) -> bool:
        """The process serves requests (liveness needs nothing else)."""
        return True

    async def ready(self) -> Readiness:
        """Kafka answers, Redis answers, and every loaded model has a live worker."""
        reasons: list[str] = [f"model {m} failed to load" for m in sorted(self.failed)]
        kafka_ok, kafka_reason = await self._kafka_ok()
        if not kafka_ok:
            reasons.append(kafka_reason)
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                counts = await self._live_workers(list(self.models), ping=True)
        except Exception as exc:
            reasons.append(f"Redis did not answer: {exc!r}")
        else:
            reasons += [
                f"model {m} has no live worker"
                for m, n in zip(self.models, counts, strict=True)
                if n < 1
            ]
        return Readiness(not reasons, tuple(reasons))

    async def _kafka_ok(self) -> tuple[bool, str]:
        """Whether Kafka answers: the cached verdict while fresh, else one check for every
        probe that overlaps it (many probes at once would each read the topics' metadata)."""
        cached = self._kafka_check.fresh()
        if cached is not None:
            return cached
        return await self._kafka_checks.run(None, self._check_kafka)

    async def _check_kafka(self) -> tuple[bool, str]:
        ok, reason = True, ""
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await self._require(self._admin).describe_topics(self._request_topics())
        except Exception as exc:
            ok, reason = False, f"Kafka did not answer: {exc!r}"
        self._kafka_check.store(ok, reason)
        return ok, reason

    async def _live_workers(self, models: list[str], *, ping: bool = False) -> list[int]:
        """Live worker counts per model, one round trip (``plaza.model_control.live_workers``:
        an ensemble counts as its live runners while each model its steps reach, through
        nested ensembles too, has a live worker, and as 0 while one has none)."""
        groups = [serving_models(m, self._spec(m), self._spec) for m in models]
        return await live_workers(self._require(self._redis), self.names, groups, ping=ping)

    def _spec(self, name: str) -> ModelSpec | None:
        model = self.models.get(name)
        return None if model is None else model.spec
