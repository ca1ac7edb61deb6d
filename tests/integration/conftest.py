"""Integration fixtures on top of tests/conftest.py: Plaza settings for this test alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plaza.settings import PlazaSettings
from plaza.stack import RedisClusterNodes, free_port
from tests.support import make_settings

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build_models.py"
MODELS = ("identity", "add_sub")
"""The models the gateway tests serve, built once per session."""


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str) -> PlazaSettings:
    """Settings on the session's real Kafka and Redis, with this test's own prefixes."""
    return make_settings(kafka_bootstrap, redis_url, unique_id)


@pytest.fixture(scope="session")
def built_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """identity and add_sub, built once per session by scripts/build_models.py."""
    target = tmp_path_factory.mktemp("gateway-models")
    cmd = [
        sys.executable,
        str(BUILD_SCRIPT),
        "--repository",
        str(target),
        "--models",
        ",".join(MODELS),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return target


@pytest.fixture
def make_repository(built_models: Path, tmp_path: Path) -> Callable[..., Path]:
    """A repository folder holding only the given models."""

    def make(*models: str) -> Path:
        root = tmp_path / f"repo-{'-'.join(models)}"
        for model in models:
            shutil.copytree(built_models / model, root / model)
        return root

    return make


@pytest.fixture
def settings_for(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    make_repository: Callable[..., Path],
    redis_client: Any,  # cleans this test's keys afterwards
) -> Callable[..., PlazaSettings]:
    def make(*models: str, **gateway: Any) -> PlazaSettings:
        return make_settings(
            kafka_bootstrap,
            redis_url,
            unique_id,
            repository=make_repository(*models),
            gateway=gateway,
        )

    return make


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A real 3-node Redis Cluster (masters only, slots split evenly), formed once per
    session and stopped at its end (tests/integration/test_redis_cluster.py)."""
    nodes = RedisClusterNodes(
        tmp_path_factory.mktemp("redis-cluster"), port=free_port(count=6), nodes=3
    )
    with nodes:
        yield nodes


@pytest.fixture
def cluster_settings(
    kafka_bootstrap: str, redis_cluster: RedisClusterNodes, unique_id: str
) -> PlazaSettings:
    """Settings on the session's Kafka and the 3-node Redis Cluster, this test's prefixes."""
    return make_settings(kafka_bootstrap, redis_cluster.url, unique_id, redis={"cluster": True})
