"""Shared fixtures: one real Kafka broker and one real Redis per test session.

Both start lazily, on the first test that asks for them (unit tests never do), on free test
ports (19092/16379 when free) under pytest's temp dir, and stop when the session ends.
Every test gets its own topic and key prefix, so tests share the services without seeing
each other's data.

To reuse services that already run (``make up`` in another terminal), set
``PLAZA_TEST_KAFKA_BOOTSTRAP`` and/or ``PLAZA_TEST_REDIS_URL``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio

from plaza.stack import KafkaCluster, RedisServer, free_port

if TYPE_CHECKING:
    from plaza.naming import Names

KAFKA_TEST_PORT = 19092  # + 19093 for the controller
REDIS_TEST_PORT = 16379


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration is marked ``integration`` (``-m 'not integration'``)."""
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


# -- services (session) --------------------------------------------------------------------


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Data and logs of the session's services (pytest keeps the last few runs' dirs)."""
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def kafka_cluster(services_dir: Path) -> Iterator[KafkaCluster]:
    """A started, ready one-node Kafka (KRaft) cluster; stopped at the end of the session."""
    port = free_port(KAFKA_TEST_PORT, count=2)
    cluster = KafkaCluster(services_dir / "kafka", nodes=1, port=port, fast_start=True)
    with cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_server(services_dir: Path) -> Iterator[RedisServer]:
    """A started, ready Redis (AOF on, appendfsync everysec); stopped at the end."""
    server = RedisServer(services_dir / "redis", port=free_port(REDIS_TEST_PORT))
    with server:
        yield server


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of the session's Kafka, e.g. ``"127.0.0.1:19092"``."""
    external = os.environ.get("PLAZA_TEST_KAFKA_BOOTSTRAP")
    if external:
        return external
    cluster: KafkaCluster = request.getfixturevalue("kafka_cluster")
    return cluster.bootstrap_servers


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of the session's Redis, e.g. ``"redis://127.0.0.1:16379/0"``."""
    external = os.environ.get("PLAZA_TEST_REDIS_URL")
    if external:
        return external
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def kafka_cluster_factory(tmp_path: Path) -> Iterator[Callable[..., KafkaCluster]]:
    """Private Kafka clusters for one test (fault tests), started and ready; stopped after.

        cluster = kafka_cluster_factory(nodes=3, min_insync_replicas=2)
        cluster.kill(1); ...; cluster.start_node(1); cluster.wait_ready()

    Keyword arguments go to :class:`KafkaCluster`; ports are picked free.
    """
    clusters: list[KafkaCluster] = []

    def make(nodes: int = 1, **options: Any) -> KafkaCluster:
        port = free_port(count=2 * nodes)
        data_dir = tmp_path / f"kafka-{len(clusters)}"
        cluster = KafkaCluster(data_dir, nodes=nodes, port=port, **options)
        clusters.append(cluster)
        cluster.start()
        cluster.wait_ready(120)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Private Redis servers for one test (restart / kill tests), started and ready.

    Keyword arguments go to :class:`RedisServer`; the port is picked free.
    """
    servers: list[RedisServer] = []

    def make(**options: Any) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}", port=free_port(), **options)
        servers.append(server)
        server.start()
        server.wait_ready()
        return server

    yield make
    for server in servers:
        server.stop()


# -- per test ------------------------------------------------------------------------------


@pytest.fixture
def unique_id() -> str:
    """A short id unique to this test: ``t`` + 8 hex digits."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic_prefix(unique_id: str) -> str:
    """This test's Kafka topic (and consumer group) prefix, e.g. ``"t1a2b3c4d."``."""
    return f"{unique_id}."


@pytest.fixture
def key_prefix(unique_id: str) -> str:
    """This test's Redis key prefix, e.g. ``"t1a2b3c4d:"``."""
    return f"{unique_id}:"


@pytest.fixture
def names(topic_prefix: str, key_prefix: str) -> Names:
    """``plaza.naming.Names`` built from this test's prefixes."""
    from plaza.naming import Names

    return Names(topic_prefix=topic_prefix, key_prefix=key_prefix)


@pytest.fixture
async def redis_client(redis_url: str, key_prefix: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A ``redis.asyncio`` client (bytes replies); this test's keys are deleted afterwards."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        keys = [key async for key in client.scan_iter(match=f"{key_prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


# -- no silent skips in CI -----------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """With PLAZA_TESTS_NO_SKIP=1 (set by .ci/run) a skipped test fails: CI installs every
    extra, so a skip there means a missing install step, not an optional feature."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("PLAZA_TESTS_NO_SKIP") == "1":
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped in CI, where nothing may be skipped: {reason}"
