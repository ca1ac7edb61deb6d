"""The gateway's own metrics: synchronous infer requests per model version, on port 8002.

The gateway runs no model, so it counts what it sees: each synchronous infer call's success
(with its duration, publish to answer) or failure (with Triton's reason), and the response
cache's hits and misses with their durations (``plaza.response_cache``), under Triton's
names, labelled with the model and the version that answered (the default version, the
newest served, when the request named none). Requests for models or versions that are not
loaded are not counted: label values come only from the repository, never from clients.

The numbers of the models themselves (queue and compute times, batch sizes, executions)
come from the workers' own /metrics ports and, summed, from the statistics API.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter

from plaza.contract import InferRequest, InferResult
from plaza.errors import ConfigError, ModelNotFound, PlazaError
from plaza.metrics import MetricsServer, failure_reason
from plaza.naming import (
    LABEL_MODEL,
    LABEL_REASON,
    LABEL_VERSION,
    METRIC_CACHE_HIT_DURATION_US,
    METRIC_CACHE_HITS,
    METRIC_CACHE_MISS_DURATION_US,
    METRIC_CACHE_MISSES,
    METRIC_REQUEST_DURATION_US,
    METRIC_REQUEST_FAILURE,
    METRIC_REQUEST_SUCCESS,
)
from plaza.settings import GatewaySettings

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[InferResult]])
S = TypeVar("S", bound=Callable[..., AsyncGenerator[InferResult, None]])


class GatewayMetrics:
    """Request counters on a registry of the gateway's own (never the global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = [LABEL_MODEL, LABEL_VERSION]
        self.success = Counter(
            METRIC_REQUEST_SUCCESS,
            "Number of successful inference requests through the gateway",
            labels,
            registry=self.registry,
        )
        self.failure = Counter(
            METRIC_REQUEST_FAILURE,
            "Number of failed inference requests through the gateway",
            [*labels, LABEL_REASON],
            registry=self.registry,
        )
        self.duration_us = Counter(
            METRIC_REQUEST_DURATION_US,
            "Cumulative duration of successful requests at the gateway, microseconds",
            labels,
            registry=self.registry,
        )

        self.cache_hits = Counter(
            METRIC_CACHE_HITS,
            "Number of response cache hits per model",
            labels,
            registry=self.registry,
        )
        self.cache_misses = Counter(
            METRIC_CACHE_MISSES,
            "Number of response cache misses per model",
            labels,
            registry=self.registry,
        )
        self.cache_hit_us = Counter(
            METRIC_CACHE_HIT_DURATION_US,
            "Total response cache hit duration per model (lookups), microseconds",
            labels,
            registry=self.registry,
        )
        self.cache_miss_us = Counter(
            METRIC_CACHE_MISS_DURATION_US,
            "Total response cache miss duration per model (lookups and stores), microseconds",
            labels,
            registry=self.registry,
        )
        self._served: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        """Each served (model, version)'s success and duration children: ``labels()``
        costs about 1 µs a call, twice for every answer. As many as the counters' own
        label sets, which are never removed."""

    def cache_hit(self, model: str, version: str, seconds: float) -> None:
        """A response cache hit (``plaza.response_cache.CacheObserver``)."""
        self.cache_hits.labels(model, version).inc()
        self.cache_hit_us.labels(model, version).inc(int(seconds * 1e6))

    def cache_miss(self, model: str, version: str, seconds: float) -> None:
        """A response cache miss (``plaza.response_cache.CacheObserver``)."""
        self.cache_misses.labels(model, version).inc()
        self.cache_miss_us.labels(model, version).inc(int(seconds * 1e6))

    def succeeded(self, model: str, version: str, seconds: float) -> None:
        children = self._served.get((model, version))
        if children is None:
            children = self.success.labels(model, version), self.duration_us.labels(model, version)
            self._served[(model, version)] = children
        children[0].inc()
        children[1].inc(int(seconds * 1e6))

    def failed(self, model: str, version: str, code: str) -> None:
        self.failure.labels(model, version, failure_reason(code)).inc()


class _Metered(Protocol):
    @property
    def metrics(self) -> GatewayMetrics: ...

    def model(self, name: str, version: str = "") -> Any: ...


def _version_label(service: _Metered, req: InferRequest) -> str | None:
    """The version the request is served by; None when the model or version is not loaded."""
    try:
        loaded = service.model(req.model, req.version)
    except ModelNotFound:
        return None
    versions: tuple[int, ...] = loaded.versions
    return req.version or (str(max(versions)) if versions else "")


def metered(infer: F) -> F:
    """Counts each call of the service's ``infer(req, timeout_s)`` in ``self.metrics``."""

    @functools.wraps(infer)
    async def wrapper(self: _Metered, req: InferRequest, *args: Any, **kwargs: Any) -> InferResult:
        started = time.monotonic()
        try:
            result = await infer(self, req, *args, **kwargs)
        except Exception as exc:
            _count_failure(self, req, exc)
            raise
        self.metrics.succeeded(
            result.model or req.model, result.version, time.monotonic() - started
        )
        return result

    return cast(F, wrapper)


def metered_stream(infer_stream: S) -> S:
    """Counts each call of the service's ``infer_stream(req, timeout_s)`` once, when its final
    response comes: a success (with its duration, publish to final response) unless that
    response is an error, then a failure with its code. A stream the caller leaves before
    its final response is not counted; one that fails (a timeout) counts as that failure."""

    @functools.wraps(infer_stream)
    async def wrapper(
        self: _Metered, req: InferRequest, *args: Any, **kwargs: Any
    ) -> AsyncGenerator[InferResult, None]:
        started = time.monotonic()
        try:
            async with contextlib.aclosing(infer_stream(self, req, *args, **kwargs)) as responses:
                async for result in responses:
                    if result.final:
                        _count_final(self, req, result, time.monotonic() - started)
                    yield result
        except Exception as exc:
            _count_failure(self, req, exc)
            raise

    return cast(S, wrapper)


def _count_final(service: _Metered, req: InferRequest, result: InferResult, seconds: float) -> None:
    if result.error is None:
        service.metrics.succeeded(result.model or req.model, result.version, seconds)
        return
    version = _version_label(service, req)
    if version is not None:
        service.metrics.failed(req.model, version, result.error.code)


def _count_failure(service: _Metered, req: InferRequest, exc: Exception) -> None:
    version = _version_label(service, req)
    if version is not None:
        code = exc.code if isinstance(exc, PlazaError) else PlazaError.code
        service.metrics.failed(req.model, version, code)


@contextlib.contextmanager
def serve_metrics(app: Any, settings: GatewaySettings) -> Iterator[MetricsServer | None]:
    """Serve the gateway app's metrics on ``metrics_port`` (8002) while the block runs.

    ``app`` is ``create_app``'s Starlette app (its service owns the registry). A negative
    port turns the metrics off; 0 takes a free port (logged). A port already taken is logged
    as an error and the gateway serves without metrics: inference matters more. The gateway's
    ``api_key``, when set, guards the metrics too.
    """
    if settings.metrics_port < 0:
        yield None
        return
    registry = app.state.service.metrics.registry
    try:
        key = settings.api_key.get_secret_value() if settings.api_key else None
        server = MetricsServer(registry, settings.host, settings.metrics_port, api_key=key)
    except ConfigError as exc:
        log.error("gateway serves no metrics: %s", exc.message)
        yield None
        return
    with server:
        log.info("gateway metrics at %s", server.url)
        yield server
