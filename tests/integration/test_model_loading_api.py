"""Triton's model loading API (``pb_utils.load_model``, ``unload_model``, ``is_model_ready``)
from a Python model's ``execute``, on real Kafka and Redis, in model control mode explicit.

A host follows the model table (``tests/integration/test_host_follow.py``'s helpers) and
serves ``loader`` (tests/python_models.py): its execute loads ``add_sub`` through the table,
which makes the host start add_sub's unit; the load returns once that unit is live; then it
asks readiness, calls add_sub through BLS and unloads it, which makes the host stop the unit
(or, asked to, keeps it loaded). The table, the host's units and the answers are checked at
each step; and unload_dependents on the table alone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from plaza.client import PlazaClient
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from plaza.workers.backends.pb_exception import TritonModelException
from plaza.workers.backends.pb_model_loader import ModelLoader
from tests.integration.test_host_follow import follower, metrics_of, serving
from tests.integration.test_host_follow import following as following_table
from tests.metrics_support import value
from tests.python_models import write_repository
from tests.support import make_settings, wait_for
from tests.unit.test_registry import _ensemble

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit, a host following the table, the Python test models in tmp_path, the
    host's execution slots the default: loader's batch, waiting on its BLS call to add_sub,
    holds no slot (a Python model takes none), so add_sub runs meanwhile."""
    repo = write_repository(tmp_path / "repository", "add_sub", "loader")
    gateway = {"model_control_mode": "explicit", "load_timeout_s": 120}
    return following_table(
        make_settings(kafka_bootstrap, redis_url, unique_id, repository=repo, gateway=gateway),
    )


async def test_a_python_model_loads_calls_and_unloads_another_model(
    settings: PlazaSettings,
) -> None:
    x = {
        "INPUT0": np.arange(4, dtype=np.float32).reshape(1, 4),
        "INPUT1": np.full((1, 4), 0.5, np.float32),
    }
    async with serving(settings) as (host, table), PlazaClient(settings) as client:
        watch = follower(host)
        await table.load("loader")
        await wait_for(lambda: "loader" in watch.state.running, 60, "loader's unit to start")
        assert "add_sub" not in await table.read()

        # Load, check readiness, call, unload: the host starts add_sub's unit, then stops it.
        done = await client.infer("loader", x, timeout_s=150)
        np.testing.assert_array_equal(done.as_numpy()["OUTPUT0"], x["INPUT0"] + 0.5)
        np.testing.assert_array_equal(done.as_numpy()["OUTPUT1"], x["INPUT0"] - 0.5)
        assert done.as_numpy()["READY"].tolist() == [[False, True, False]]
        first = (await table.read())["add_sub"]
        assert not first.loaded
        await wait_for(lambda: "add_sub" not in watch.state.running, 90, "add_sub to stop")
        got = metrics_of(host)
        assert value(got, "plaza_host_model_loads", model="add_sub") == 1
        assert value(got, "plaza_host_model_unloads", model="add_sub") == 1

        # Load again and keep it: a new generation, loaded in the table, its unit runs.
        kept = await client.infer("loader", x, parameters={"unload": False}, timeout_s=150)
        np.testing.assert_array_equal(kept.as_numpy()["OUTPUT0"], x["INPUT0"] + 0.5)
        assert kept.as_numpy()["READY"].tolist() == [[False, True, True]]
        last = (await table.read())["add_sub"]
        assert last.loaded and last.config == "" and last.generation > first.generation
        await wait_for(lambda: "add_sub" in watch.state.running, 60, "add_sub to run again")
        assert value(metrics_of(host), "plaza_host_model_loads", model="add_sub") == 2
        assert (await table.read())["loader"].loaded  # the caller itself stays


async def test_unload_dependents_unloads_the_ensembles_calling_the_model(
    settings: PlazaSettings,
) -> None:
    """A model process's loader on real Redis, no workers: unload with ``unload_dependents``
    marks the loaded ensembles that call the model, directly or through another, unloaded
    too, and leaves the others; a model loaded in the table without a live worker is not
    ready."""
    repo = Path(settings.repository)
    _ensemble(repo, "inner", "add_sub")
    _ensemble(repo, "outer", "inner")
    _ensemble(repo, "apart", "loader")
    redis = aioredis.Redis.from_url(settings.redis.url)
    table = ModelTable(redis, settings.names)
    loader = ModelLoader(lambda: settings)
    try:
        for name in ("add_sub", "inner", "outer", "apart"):
            await table.load(name)
        assert not await asyncio.to_thread(loader.ready, "apart", "")
        await asyncio.to_thread(loader.unload, "add_sub", True)
        states = {name: desired.loaded for name, desired in (await table.read()).items()}
        assert states == {"add_sub": False, "inner": False, "outer": False, "apart": True}
        with pytest.raises(TritonModelException, match="failed to unload 'nope'"):
            await asyncio.to_thread(loader.unload, "nope", False)
    finally:
        await asyncio.to_thread(loader.close)
        await redis.aclose()
