"""Poll mode and ensembles (real Kafka and Redis): a step model's folder that leaves takes
the ensembles that run it along (as every unload does, as in Triton), and when the folder
comes back the ensemble is served again, though its own folder never changed (it stayed
unloaded until its folder changed or the gateway restarted)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from plaza.gateway.registry import ModelRegistry
from tests.support import REPOSITORY, make_settings
from tests.unit.test_registry import _ensemble

pytestmark = pytest.mark.timeout(120)


async def test_an_ensemble_comes_back_with_its_step_model(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    tmp_path: Path,
    redis_client: aioredis.Redis,  # deletes this test's keys afterwards
) -> None:
    root = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "simulated", root / "simulated")
    _ensemble(root, "ens", "simulated")
    gateway = {"model_control_mode": "poll", "load_timeout_s": 1}
    settings = make_settings(
        kafka_bootstrap, redis_url, unique_id, repository=root, gateway=gateway
    )
    registry = ModelRegistry(settings)
    registry.read_start_models()
    await registry.start(redis_client)
    assert sorted(registry.models) == ["ens", "simulated"]
    shutil.move(root / "simulated", tmp_path / "away")
    await registry.poll()
    assert sorted(registry.models) == []  # the step left, and its ensemble with it
    shutil.move(tmp_path / "away", root / "simulated")
    await registry.poll()  # the step comes back
    await registry.poll()  # then the ensemble that runs it
    assert sorted(registry.models) == ["ens", "simulated"]
