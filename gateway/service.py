"""The gateway's data plane: models, infer, jobs and health, with no HTTP types.

The HTTP front (``gateway/app.py``) and a gRPC front call the same methods. Requests are
validated here before they are published (early InvalidInput), published once to the
model's Kafka topic, and answered through the reply multiplexer (sync) or the result key
(async jobs). Errors are PlazaErrors; only ``gateway/errors.py`` turns them into statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient

from plaza.connections import ensure_topics, kafka_admin, redis_client
from plaza.contract import InferRequest, InferResult, ReplyTo
from plaza.errors import (
    DeadlineExceeded,
    JobNotFound,
    ModelNotFound,
    PlazaError,
    Unavailable,
)
from plaza.gateway.metrics import GatewayMetrics, metered
from plaza.gateway.stats import read_statistics
from plaza.modelconfig import ModelSpec
from plaza.publisher import RequestPublisher
from plaza.queueing import BacklogProbe, QueueGuard, settle_priority
from plaza.replies import ReplyMux
from plaza.repository import ModelRepository
from plaza.results import JobStatus, ResultStore, raise_for_error
from plaza.settings import PlazaSettings
from plaza.validation import validate_request

log = logging.getLogger(__name__)

KAFKA_CHECK_TTL_S = 1.0
"""How long a Kafka health answer is reused (readiness probes come often)."""
CHECK_TIMEOUT_S = 2.0
"""A health check that takes longer than this counts as failed."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model the gateway serves: its config and the versions its policy selects."""

    spec: ModelSpec
    versions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Readiness:
    """The answer of a readiness check; ``reasons`` says what is missing when not ready."""

    ready: bool
    reasons: tuple[str, ...] = ()


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
        self.models: dict[str, LoadedModel] = {}
        self.failed: dict[str, str] = {}
        """Models in the repository that could not be read, with the reason."""
        self._redis: aioredis.Redis | None = None
        self._publisher = RequestPublisher(settings.kafka, self.names)
        self._admin: AIOKafkaAdminClient | None = None
        self._mux: ReplyMux | None = None
        self._results: ResultStore | None = None
        self._kafka_check = _CachedCheck(KAFKA_CHECK_TTL_S)
        self._backlog = BacklogProbe(settings.kafka, self.names)
        self._guard = QueueGuard(self._backlog, self.names)
        self.metrics = GatewayMetrics()

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Read the repository, create the request topics, connect Kafka and Redis."""
        self.load_repository()
        await ensure_topics(self.settings.kafka, self._request_topics())
        self._redis = redis_client(self.settings.redis)
        self._results = ResultStore(self._redis, self.settings.redis, self.names)
        await self._publisher.start()
        self._admin = kafka_admin(self.settings.kafka)
        await self._admin.start()
        await self._backlog.start()
        self._mux = ReplyMux(
            self._redis,
            self.names.reply_stream(self.gateway_id),
            ttl_s=self.settings.redis.reply_stream_ttl_s,
            maxlen=self.settings.redis.stream_maxlen,
        )
        await self._mux.start()

    async def stop(self) -> None:
        """Release everything start() took; safe to call after a failed start."""
        if self._mux is not None:
            await self._mux.stop()
        with contextlib.suppress(Exception):
            await self._publisher.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
            with contextlib.suppress(Exception):
                await self._backlog.stop()
        if self._redis is not None:
            await self._redis.aclose()
        self._mux = self._admin = self._redis = self._results = None

    def load_repository(self) -> None:
        """Read every model of the repository (model_control_mode none: all are loaded)."""
        repo = ModelRepository(self.settings.repository)
        self.models, self.failed = {}, {}
        for name in repo.model_names():
            try:
                spec = repo.spec(name)
                versions = tuple(v.version for v in repo.served_versions(name, spec))
            except PlazaError as exc:
                log.error("model %s is not served: %s", name, exc.message)
                self.failed[name] = exc.message
                continue
            self.models[name] = LoadedModel(spec, versions)

    def _request_topics(self) -> list[str]:
        topics: list[str] = []
        for model in self.models.values():
            levels = model.spec.batching.priority_levels
            topics += [self.names.request_topic(model.spec.name, p) for p in range(1, levels + 1)]
            if levels == 0:
                topics.append(self.names.request_topic(model.spec.name))
        return sorted(set(topics))

    # -- models --------------------------------------------------------------------------
    def model(self, name: str, version: str = "") -> LoadedModel:
        """The loaded model (and version, "" for its default); ModelNotFound otherwise."""
        model = self.models.get(name)
        if model is None:
            reason = self.failed.get(name)
            detail = f" (failed to load: {reason})" if reason else ""
            raise ModelNotFound(f"model {name!r} is not loaded{detail}", model=name)
        if version and (not version.isdigit() or int(version) not in model.versions):
            raise ModelNotFound(f"model {name!r} has no version {version!r} loaded", model=name)
        return model

    def model_metadata(self, name: str, version: str = "") -> LoadedModel:
        """What the metadata endpoint describes (rendered by ``plaza.gateway.kserve``)."""
        return self.model(name, version)

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """Triton's JSON form of the model's config.pbtxt."""
        return self.model(name, version).spec.config_json()

    async def model_ready(self, name: str, version: str = "") -> bool:
        """The model is loaded and at least one of its workers is alive."""
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

    async def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of every model, one model or one version (``gateway.stats``)."""
        chosen = {name: self.model(name, version)} if name else self.models
        return await read_statistics(self._require(self._redis), self.names, chosen, version)

    # -- inference -----------------------------------------------------------------------
    def sync_timeout(self, timeout_us: int | None) -> float:
        """Seconds a sync call waits: the configured wait, shortened by a request timeout."""
        configured = self.settings.gateway.sync_timeout_s
        return configured if timeout_us is None else min(configured, timeout_us / 1e6)

    @metered
    async def infer(self, req: InferRequest, timeout_s: float | None = None) -> InferResult:
        """Publish ``req`` and wait for its result.

        On timeout raises DeadlineExceeded with ``details["job_id"]``: the job stays
        pollable under that id. A result that carries an error is raised as that error.
        """
        mux = self._require(self._mux)
        req = replace(self._prepare(req), reply=ReplyTo(stream=mux.stream))
        await self._admit(req)
        wait_s = self.settings.gateway.sync_timeout_s if timeout_s is None else timeout_s
        fut = mux.expect(req.id)  # before publishing: the reply may beat the ack
        try:
            async with asyncio.timeout(wait_s):
                await self._publisher.publish(req)
                result = await fut
        except TimeoutError:
            await self._mark_submitted(req)
            raise DeadlineExceeded(
                f"no result within {wait_s:g} s; poll the job for it", job_id=req.id
            ) from None
        finally:
            mux.forget(req.id)
        return raise_for_error(result)

    async def submit(self, req: InferRequest) -> str:
        """Publish ``req`` as an async job; the result goes only to its result key."""
        req = replace(self._prepare(req), reply=ReplyTo())
        await self._admit(req)
        await self._mark_submitted(req)
        await self._publisher.publish(req)
        return req.id

    async def poll(self, job_id: str) -> JobStatus:
        """pending or done (with the result); JobNotFound for an id never submitted."""
        try:
            status = await self._require(self._results).poll(job_id)
        except Exception as exc:
            raise Unavailable(f"Redis did not answer: {exc}") from exc
        if status.state == "unknown":
            raise JobNotFound(f"no job {job_id!r} (never submitted, or expired)", job_id=job_id)
        return status

    def _prepare(self, req: InferRequest) -> InferRequest:
        """Validate ``req`` against its model; settle its priority level."""
        spec = self.model(req.model, req.version).spec
        validate_request(req, spec)
        level = settle_priority(spec, req.priority)
        return req if level == req.priority else replace(req, priority=level)

    async def _admit(self, req: InferRequest) -> None:
        """QueueFull at once when the request's queue is at max_queue_size."""
        spec = self.model(req.model, req.version).spec
        try:
            await self._guard.check(spec, req.priority)
        except PlazaError:
            raise
        except Exception as exc:
            raise Unavailable(f"Kafka did not answer the backlog check: {exc}") from exc

    async def _mark_submitted(self, req: InferRequest) -> None:
        try:
            await self._require(self._results).mark_submitted(req.id, req.model)
        except Exception as exc:
            raise Unavailable(f"Redis did not answer: {exc}") from exc

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
        cached = self._kafka_check.fresh()
        if cached is not None:
            return cached
        ok, reason = True, ""
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await self._require(self._admin).describe_topics(self._request_topics())
        except Exception as exc:
            ok, reason = False, f"Kafka did not answer: {exc!r}"
        self._kafka_check.store(ok, reason)
        return ok, reason

    async def _live_workers(self, models: list[str], *, ping: bool = False) -> list[int]:
        """Live worker counts per model (heartbeat expiry in the future), one round trip."""
        pipe = self._require(self._redis).pipeline(transaction=False)
        if ping:
            pipe.ping()
        now = time.time()  # registry scores are epoch seconds
        for name in models:
            pipe.zcount(self.names.worker_registry_key(name), now, "+inf")
        replies = await pipe.execute()
        return [int(n) for n in replies[1 if ping else 0 :]]
