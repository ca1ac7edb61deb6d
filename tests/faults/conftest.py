"""Fault-test fixtures: a test's deployment, its Plaza subprocesses, the FAULT summary lines.

Services come from tests/conftest.py: the session's Kafka and Redis for faults that do not
touch them, private ones (``kafka_cluster_factory``, ``redis_server_factory``) for faults
that kill or restart them. Each test has its own topic and key prefix (``unique_id``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import RedisError

from plaza.stack import Deployment
from tests.faults.audit import FaultReport
from tests.faults.harness import fault_deployment
from tests.faults.processes import FaultProcesses

_REPORTS: list[FaultReport] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: kills and restarts real processes (tests/faults)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fault tests need real services: mark them ``integration`` and ``faults``."""
    for item in items:
        if "faults" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.faults)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The FAULT lines of this run, together at the end of the output."""
    if _REPORTS:
        terminalreporter.section("fault summary")
        for report in _REPORTS:
            terminalreporter.write_line(report.line())
            terminalreporter.write_line("  " + report.detail_line())


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[FaultProcesses]:
    """Start ``plaza worker`` / ``plaza gateway`` processes; logs in the test's tmp dir."""
    procs = FaultProcesses(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all(timeout=15)
        print(procs.tails(15))  # shown by pytest when the test failed


@pytest.fixture
def record_fault() -> Callable[[FaultReport], None]:
    """Print a test's FAULT line (and details) and keep it for the run's summary."""

    def record(report: FaultReport) -> None:
        print(report.line(), flush=True)
        print(report.detail_line(), flush=True)
        _REPORTS.append(report)

    return record


@pytest.fixture
async def redis_for() -> AsyncIterator[Callable[[str], redis.asyncio.Redis]]:
    """Redis clients for a URL (bytes replies), closed after the test."""
    clients: list[redis.asyncio.Redis] = []

    def make(url: str) -> redis.asyncio.Redis:
        client = redis.asyncio.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=1)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
async def deployments(
    request: pytest.FixtureRequest, unique_id: str
) -> AsyncIterator[Callable[..., Deployment]]:
    """Make this test's deployment: the session's Kafka and Redis unless others are given.

        dep = deployments()                                     # session services
        dep = deployments(bootstrap=cluster.bootstrap_servers)  # a private Kafka

    Other keyword arguments go to ``plaza.stack.Deployment``. Its Redis keys are deleted
    after.
    """
    made: list[Deployment] = []

    def make(
        bootstrap: str | None = None, redis_url: str | None = None, **options: Any
    ) -> Deployment:
        dep = fault_deployment(
            bootstrap or request.getfixturevalue("kafka_bootstrap"),
            redis_url or request.getfixturevalue("redis_url"),
            unique_id,
            **options,
        )
        made.append(dep)
        return dep

    yield make
    for dep in made:
        with contextlib.suppress(RedisError, OSError):  # a private Redis may be gone
            await _delete_keys(dep.redis_url, dep.names.key_prefix)


async def _delete_keys(url: str, prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
