"""A gateway started after the model hosts refused a reload, on real Kafka and Redis.

The hosts keep the old generation's unit serving when they refuse a reload, and the
gateways that served it serve its config again (``test_refused_reload_gateway.py``). A
gateway started after the refusal never read that config: the model table keeps it with
the new generation's entry (``DesiredModel.previous``), so this one serves what the
running ones serve, the config the live worker runs. The refused reload here is a
config.pbtxt edited on disk (the old text is gone from the repository) or a load's
override; ``sim`` is reshaped from 16 values a row to 8. No host runs: the refusal is
written as a host writes it (``ModelTable.fail``), the live worker is its registry entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from plaza.gateway.registry import ModelRegistry
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from tests.integration.test_refused_reload_gateway import (
    MODEL,
    heartbeat,
    reshaped,
    served_dims,
    settings_config,
)
from tests.support import explicit_sim_settings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit, ``sim`` (simulated, 16 values a row) in a repository of its own."""
    made = explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)
    gateway = made.gateway.model_copy(update={"metrics_port": -1})
    return made.model_copy(update={"gateway": gateway})


async def started(settings: PlazaSettings, redis: aioredis.Redis) -> ModelRegistry:
    registry = ModelRegistry(settings)
    registry.read_start_models()
    await registry.start(redis)
    return registry


def edit_width(settings: PlazaSettings, width: int) -> None:
    """Rewrite ``sim``'s config.pbtxt with ``width`` values a row (a config edited on disk)."""
    path = settings.repository / MODEL / "config.pbtxt"
    path.write_text(path.read_text().replace("dims: [ 16 ]", f"dims: [ {width} ]"))


@pytest.mark.parametrize("how", ["edited", "override"])
async def test_a_gateway_started_after_a_refused_reload_serves_the_config_still_running(
    settings: PlazaSettings, redis_client: aioredis.Redis, how: str
) -> None:
    table = ModelTable(redis_client, settings.names)
    loading = await started(settings, redis_client)
    config = settings_config(loading)
    await loading.load(MODEL)
    first = await table.get(MODEL)
    assert first is not None
    await heartbeat(redis_client, settings, "old", first.generation)  # its worker is live

    if how == "edited":
        edit_width(settings, 8)
        await loading.load(MODEL)  # a reload: the folder changed
    else:
        await loading.load(MODEL, reshaped(config, 8))
    refused = await table.get(MODEL)
    assert refused is not None and refused.generation != first.generation
    assert await table.fail(refused, "the new config's worker could not be made")
    await loading.follow()
    assert served_dims(loading) == [16]  # the running gateway serves the old config

    late = await started(settings, redis_client)  # never read the old config itself
    assert served_dims(late) == [16]
    assert late.models[MODEL].versions == loading.models[MODEL].versions
    [row] = [r for r in late.index({MODEL: 1}) if r.name == MODEL]
    assert row.state == "READY", row
    assert "the previous config serves" in row.reason, row

    # A second refused reload still serves the config the live worker runs.
    await loading.load(MODEL, reshaped(config, 4))
    again = await table.get(MODEL)
    assert again is not None
    assert await table.fail(again, "refused again")
    later = await started(settings, redis_client)
    assert served_dims(later) == [16]


async def test_a_late_gateway_after_two_quick_reloads_serves_the_config_still_running(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """A reload superseded before the hosts answered it (8 values a row) never ran: the
    hosts refuse the next one (4) while the first generation's worker (16) runs on. A
    gateway started afterwards serves 16, the config that worker runs, not the refused one
    (the entry once kept only the superseded generation's config, which no worker names)."""
    table = ModelTable(redis_client, settings.names)
    loading = await started(settings, redis_client)
    config = settings_config(loading)
    await loading.load(MODEL)
    first = await table.get(MODEL)
    assert first is not None
    await heartbeat(redis_client, settings, "old", first.generation)  # its worker is live
    await loading.load(MODEL, reshaped(config, 8))  # the hosts have not answered it yet
    await loading.load(MODEL, reshaped(config, 4))  # and this one supersedes it
    refused = await table.get(MODEL)
    assert refused is not None
    assert first.generation in [p.generation for p in refused.previous]
    assert await table.fail(refused, "the new config's worker could not be made")
    await loading.follow()
    assert served_dims(loading) == [16]

    late = await started(settings, redis_client)
    assert served_dims(late) == [16]
    [row] = [r for r in late.index({MODEL: 1}) if r.name == MODEL]
    assert row.state == "READY" and "the previous config serves" in row.reason, row
