"""Kafka and Redis for a Plaza: started here under a data dir, or ones that already run."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, Self

from plaza.stack.deployment import Deployment
from plaza.stack.kafka_cluster import KafkaCluster
from plaza.stack.ports import free_port
from plaza.stack.redis_server import RedisServer

KAFKA_READY_S = 120.0


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
                data_dir / "kafka", nodes=kafka_nodes, port=port, fast_start=fast_start
            )
        if redis_url is None:
            port = redis_port if redis_port is not None else free_port()
            self.redis = RedisServer(data_dir / "redis", port=port, password=redis_password)
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

    def down(self) -> list[str]:
        """The services started here that are no longer running ([] while all run)."""
        gone = []
        if self.kafka is not None:
            gone += [f"kafka node {n}" for n in self.kafka.node_ids if not self.kafka.is_running(n)]
        if self.redis is not None and not self.redis.running:
            gone.append("redis")
        return gone

    def start(self) -> Self:
        """Start what is started here and wait until it answers (both start at once)."""
        if self.redis is not None:
            self.redis.start()
        if self.kafka is not None:
            self.kafka.start()
        if self.redis is not None:
            self.redis.wait_ready(self.ready_timeout_s)
        if self.kafka is not None:
            self.kafka.wait_ready(self.ready_timeout_s)
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
