"""A worker whose Redis refuses it or does not answer fails its start with one typed error,
before it loads its model or takes partitions: it would otherwise log "serving", take
requests and never answer one (its heartbeat only logs failed writes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plaza.errors import ConfigError, Unavailable
from plaza.stack import RedisServer, free_port
from plaza.workers.worker import Worker
from tests.support import make_settings


@pytest.fixture
def locked_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own that wants a password (``requirepass``)."""
    with RedisServer(tmp_path / "redis", port=free_port(), password="right-one") as server:
        yield server


@pytest.mark.parametrize("password", ["wrong-one", None])
async def test_a_worker_refused_by_redis_does_not_start(
    locked_redis: RedisServer, kafka_bootstrap: str, unique_id: str, password: str | None
) -> None:
    url = f"redis://127.0.0.1:{locked_redis.port}/0"
    redis = {"password": password} if password else {}
    settings = make_settings(kafka_bootstrap, url, unique_id, model="add_sub", redis=redis)
    worker = Worker(settings)
    with pytest.raises(ConfigError, match=r"redis\.password") as caught:
        await worker.start()
    assert "wrong-one" not in str(caught.value)


async def test_a_worker_without_redis_does_not_start(kafka_bootstrap: str, unique_id: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = make_settings(kafka_bootstrap, url, unique_id, model="add_sub")
    worker = Worker(settings)
    with pytest.raises(Unavailable, match="Redis did not answer"):
        await worker.start()
