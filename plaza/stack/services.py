"""Kafka and Redis for a Plaza: started here under a data dir, or ones that already run."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from plaza.stack.data_dir import Layout, clear_data_dir
from plaza.stack.deployment import Deployment
from plaza.stack.errors import Interrupted, ServiceError
from plaza.stack.kafka_cluster import KafkaCluster
from plaza.stack.ports import free_port
from plaza.stack.redis_server import RedisServer

KAFKA_READY_S = 120.0
KAFKA_DIR = "kafka"
REDIS_DIR = "redis"
LAYOUT: Layout = {KAFKA_DIR: KafkaCluster.OWN_ENTRIES, REDIS_DIR: RedisServer.OWN_ENTRIES}
"""What a data dir of :class:`Services` holds: a folder per service, each its own layout."""


class Services:
    """Kafka + Redis: each started here (under ``data_dir``) unless its address is given.

    Ports are free ones unless given. ``fast_start`` trades the JVM's peak speed for a
    quicker start (tests, not benchmarks). Use as a context manager (start, wait until
    both answer; stop on exit) or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        bootstrap: str | None = None,
        redis_url: str | None = None,
        kafka_port: int | None = None,
        kafka_nodes: int = 1,
        redis_port: int | None = None,
        redis_password: str | None = None,
        fast_start: bool = False,
        ready_timeout_s: float = KAFKA_READY_S,
    ) -> None:
        self.kafka: KafkaCluster | None = None
        self.redis: RedisServer | None = None
        if bootstrap is None:
            port = kafka_port if kafka_port is not None else free_port(count=2 * kafka_nodes)
            self.kafka = KafkaCluster(
                data_dir / KAFKA_DIR, nodes=kafka_nodes, port=port, fast_start=fast_start
            )
        if redis_url is None:
            port = redis_port if redis_port is not None else free_port()
            self.redis = RedisServer(data_dir / REDIS_DIR, port=port, password=redis_password)
        self._bootstrap = bootstrap
        self._redis_url = redis_url
        self.ready_timeout_s = ready_timeout_s

    @property
    def bootstrap(self) -> str:
        """Kafka's bootstrap servers."""
        if self.kafka is not None:
            return self.kafka.bootstrap_servers
        return self._bootstrap or ""

    @property
    def redis_url(self) -> str:
        """Redis's URL."""
        if self.redis is not None:
            return self.redis.url
        return self._redis_url or ""

    def deployment(self, repository: Path, prefix: str = "plaza", **options: Any) -> Deployment:
        """A :class:`Deployment` on these services (``options`` go to it)."""
        return Deployment(self.bootstrap, self.redis_url, repository, prefix, **options)

    @staticmethod
    def clear_data_dir(data_dir: Path) -> None:
        """Delete what Services made in ``data_dir`` (a fresh start); refuse, deleting
        nothing, if it holds anything else (``plaza.stack.data_dir``)."""
        clear_data_dir(data_dir, LAYOUT)

    def ports(self) -> dict[str, list[int]]:
        """The ports of the services started here, by role (``kafka``, ``kafka controller``,
        ``redis``; a role with none started here is left out)."""
        ports: dict[str, list[int]] = {}
        if self.kafka is not None:
            nodes = list(self.kafka.node_ids)
            ports["kafka"] = [self.kafka.port + n for n in nodes]
            ports["kafka controller"] = [self.kafka.controller_port + n for n in nodes]
        if self.redis is not None:
            ports["redis"] = [self.redis.port]
        return ports

    def check(self) -> None:
        """:class:`ServiceError` with the exit code and log tail of every service started
        here that exited without being asked to."""
        failures = []
        for service in (self.kafka, self.redis):
            if service is None:
                continue
            try:
                service.check()
            except ServiceError as exc:
                failures.append(exc.message)
        if failures:
            raise ServiceError("\n".join(failures))

    def start(self, stop: threading.Event | None = None) -> Self:
        """Start what is started here and wait until it answers (both start at once).

        Once ``stop`` is set (Ctrl-C, SIGTERM) it raises :class:`Interrupted` at the next
        step or within a moment of a readiness wait; what had started still runs then:
        call :meth:`stop`.
        """
        if self.redis is not None:
            self.redis.start()
        if self.kafka is not None:
            _stop_point(stop, "before starting Kafka")
            self.kafka.start()
        if self.redis is not None:
            self.redis.wait_ready(self.ready_timeout_s, stop)
        if self.kafka is not None:
            self.kafka.wait_ready(self.ready_timeout_s, stop)
        return self

    def stop(self) -> None:
        """Stop what was started here (Kafka first: its clients are gone by then)."""
        if self.kafka is not None:
            self.kafka.stop()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _stop_point(stop: threading.Event | None, where: str) -> None:
    if stop is not None and stop.is_set():
        raise Interrupted(f"stopped {where}")
