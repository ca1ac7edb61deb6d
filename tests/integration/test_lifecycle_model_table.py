"""Model control over the model table on real Kafka and Redis, without workers: gateways
(``ModelRegistry``) follow reloads made through another gateway, an unload sent while a load
reads the model wins, and loading an ensemble loads its step models.

A load's read of the model is held at a gate (``plaza.gateway.registry.read_load``, the
reading a Python model's ``auto_complete_config`` makes slow) where a test needs an unload
to come while it runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import plaza.gateway.registry as registry_module
from plaza.errors import ConfigError, Unavailable
from plaza.gateway.registry import ModelRegistry
from plaza.model_control import DesiredModel, ModelTable
from plaza.settings import PlazaSettings
from tests.support import explicit_sim_settings, wait_for
from tests.unit.test_registry import _ensemble

pytestmark = pytest.mark.timeout(120)

Starter = Callable[[], Awaitable[ModelRegistry]]


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit on this test's prefixes; ``sim`` (a simulated model, every version
    served) in a repository of its own, nothing loaded at start."""
    return explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)


@pytest.fixture
def gateways(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> Callable[[], Awaitable[ModelRegistry]]:
    """Starts gateways' registries on the one model table."""

    async def started() -> ModelRegistry:
        registry = ModelRegistry(settings)
        registry.read_start_models()
        await registry.start(redis_client)
        return registry

    return started


class Gate:
    """Holds every load's read of the model (on its thread) until opened."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def wrap(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            self.opened.wait(60)
            return read(*args, **kwargs)

        return held


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate()
    monkeypatch.setattr(registry_module, "read_load", held.wrap(registry_module.read_load))
    try:
        yield held
    finally:
        held.opened.set()  # never leave a reading thread waiting


async def table_entry(settings: PlazaSettings, redis: aioredis.Redis, name: str) -> DesiredModel:
    desired = await ModelTable(redis, settings.names).get(name)
    assert desired is not None
    return desired


# -- several gateways follow a reload ---------------------------------------------------------


async def test_other_gateways_follow_a_reload_of_new_versions_and_an_edited_config(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter
) -> None:
    a, b = await gateways(), await gateways()
    await a.load("sim")
    await b.follow()
    assert b.models["sim"].versions == (1,)

    (Path(settings.repository) / "sim" / "2").mkdir()  # a new version folder, then a reload
    await a.load("sim")
    await b.follow()
    assert a.models["sim"].versions == b.models["sim"].versions == (1, 2)

    config = Path(settings.repository) / "sim" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 16", "max_batch_size: 2"))
    await a.load("sim")
    await b.follow()
    assert b.models["sim"].spec.max_batch_size == 2
    assert (await table_entry(settings, redis_client, "sim")).config == ""  # a plain reload


# -- an unload during a load ----------------------------------------------------------------


async def test_an_unload_through_another_gateway_during_a_load_wins(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter, gate: Gate
) -> None:
    a, b = await gateways(), await gateways()
    loading = asyncio.create_task(a.load("sim"))
    await wait_for(gate.entered.is_set, 30, "the load to read the model")
    await b.unload("sim")
    gate.opened.set()
    with pytest.raises(Unavailable, match="'sim': it was unloaded while this load read it"):
        await loading
    assert not (await table_entry(settings, redis_client, "sim")).loaded
    assert "sim" not in a.models
    await a.follow()
    await b.follow()
    assert "sim" not in a.models and "sim" not in b.models


async def test_an_unload_through_the_same_gateway_during_a_load_comes_after_it(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter, gate: Gate
) -> None:
    """Triton serialises a model's loads and unloads: the load finishes, then the unload
    sent during it is applied, and the model ends unloaded."""
    gateway = await gateways()
    loading = asyncio.create_task(gateway.load("sim"))
    await wait_for(gate.entered.is_set, 30, "the load to read the model")
    unloading = asyncio.create_task(gateway.unload("sim"))
    gate.opened.set()
    loaded = await loading
    await unloading
    assert loaded.versions == (1,)
    assert not (await table_entry(settings, redis_client, "sim")).loaded
    assert "sim" not in gateway.models
    await gateway.follow()
    assert "sim" not in gateway.models
    assert [row.reason for row in gateway.index({}) if row.name == "sim"] == ["unloaded"]


async def test_a_load_of_the_same_config_through_another_gateway_during_a_load_is_no_conflict(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter, gate: Gate
) -> None:
    """Two gateways polling one repository load a changed model at once: both succeed."""
    a, b = await gateways(), await gateways()
    loading = asyncio.create_task(a.load("sim"))
    await wait_for(gate.entered.is_set, 30, "the load to read the model")
    gate.entered.clear()
    other = asyncio.create_task(b.load("sim"))
    await wait_for(gate.entered.is_set, 30, "the other load to read the model")
    gate.opened.set()
    await asyncio.gather(loading, other)
    entry = await table_entry(settings, redis_client, "sim")
    assert entry.loaded
    await b.follow()
    assert "sim" in a.models and "sim" in b.models


# -- ensembles --------------------------------------------------------------------------------


async def test_loading_an_ensemble_loads_its_step_models_and_unloading_it_leaves_them(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter
) -> None:
    """Triton's explicit mode: an ensemble's composing models are loaded with it (those not
    loaded yet, through nested ensembles); its unload leaves them loaded."""
    root = Path(settings.repository)
    _ensemble(root, "inner", "sim")
    _ensemble(root, "outer", "inner")
    gateway, other = await gateways(), await gateways()
    await gateway.load("outer")
    table = await ModelTable(redis_client, settings.names).read()
    assert {name for name, desired in table.items() if desired.loaded} == {"outer", "inner", "sim"}
    assert {"outer", "inner", "sim"} <= set(gateway.models)
    await other.follow()
    assert {"outer", "inner", "sim"} <= set(other.models)

    step = table["sim"].generation
    await gateway.unload("outer")
    await gateway.load("outer")  # its steps are loaded already: not loaded again
    table = await ModelTable(redis_client, settings.names).read()
    assert table["outer"].loaded and table["inner"].loaded
    assert table["sim"].loaded and table["sim"].generation == step

    await gateway.unload("outer")
    table = await ModelTable(redis_client, settings.names).read()
    assert not table["outer"].loaded
    assert table["inner"].loaded and table["sim"].loaded
    assert "inner" in gateway.models and "sim" in gateway.models


async def test_an_ensemble_whose_step_is_not_in_the_repository_is_not_loaded(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter
) -> None:
    _ensemble(Path(settings.repository), "lost", "nowhere")
    gateway = await gateways()
    with pytest.raises(ConfigError, match="failed to load 'lost': step model 'nowhere'"):
        await gateway.load("lost")
    assert await ModelTable(redis_client, settings.names).read() == {}
    assert "lost" not in gateway.models
    assert "nowhere" in gateway.failed["lost"]


async def test_a_load_waits_for_the_ensembles_step_workers_not_forever(
    settings: PlazaSettings, redis_client: aioredis.Redis, gateways: Starter
) -> None:
    """Without hosts the wait ends with Unavailable after load_timeout_s, the ensemble and
    its step loaded in the table (they turn ready when hosts serve them)."""
    _ensemble(Path(settings.repository), "ens", "sim")
    gateway = await gateways()
    with pytest.raises(Unavailable, match="no worker serves it"):
        await gateway.load("ens", wait=True)
    table = await ModelTable(redis_client, settings.names).read()
    assert table["ens"].loaded and table["sim"].loaded
