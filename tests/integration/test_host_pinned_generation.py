"""A following host serves what a generation's load read, whatever the folder holds later.

Real Kafka and Redis, a model host following the table and ``ModelControl`` loading through
it. Each test changes the model's folder after a load, without loading again (an operator
staging the next config or version): a unit started later (a lazy model's first request,
an evicted model back on demand) still serves the generation's pinned config and versions;
after a refused reload an evicted unit comes back as the generation that served; and
readiness is read from the load's record and the live workers, not from the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient
from plaza.errors import ConfigError
from plaza.model_control import ModelControl, live_generations
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.host import Host
from plaza.workers.model_watch import ModelFollower
from tests.support import make_settings, wait_for

pytestmark = pytest.mark.timeout(300)

CONFIG = """
name: "{name}"
backend: "plaza_simulated"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
parameters [
  {{ key: "latency_b_us" value: {{ string_value: "{latency}" }} }},
  {{ key: "memory_bytes" value: {{ string_value: "{nbytes}" }} }},
  {{ key: "lazy" value: {{ string_value: "{lazy}" }} }}
]
"""
X = {"INPUT0": np.ones((1, 4), dtype=np.float32)}


def write_config(
    root: Path,
    name: str,
    *,
    width: int = 4,
    latency: str = "500",
    nbytes: int = 0,
    lazy: bool = False,
) -> None:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    text = CONFIG.format(
        name=name, width=width, latency=latency, nbytes=nbytes, lazy=str(lazy).lower()
    )
    (root / name / "config.pbtxt").write_text(text)


def following(settings: PlazaSettings, **host: object) -> PlazaSettings:
    update = {"models": "*", "follow_model_table": True, "follow_interval_s": 0.2, **host}
    worker = settings.worker.model_copy(update={"worker_id": "ph", "metrics_port": 0})
    return settings.model_copy(
        update={"host": settings.host.model_copy(update=update), "worker": worker}
    )


@contextlib.asynccontextmanager
async def serving(settings: PlazaSettings) -> AsyncIterator[tuple[ModelFollower, ModelControl]]:
    client = redis.asyncio.Redis.from_url(settings.redis.url)
    repo = ModelRepository.of(settings)
    control = ModelControl(client, settings.names, settings.kafka, repo, load_timeout_s=60)
    host = Host(settings)
    stop = asyncio.Event()
    await host.start()
    task = asyncio.create_task(host.run_until_stopped(stop))
    try:
        assert host.follower is not None
        yield host.follower, control
    finally:
        stop.set()
        await task
        await client.aclose()


async def test_a_lazy_unit_started_late_serves_its_loads_config_and_versions(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    write_config(root, "lz", lazy=True)
    settings = following(make_settings(kafka_bootstrap, redis_url, unique_id, repository=root))
    async with serving(settings) as (watch, control), PlazaClient(settings) as client:
        loaded = await control.load("lz")
        assert loaded.versions == (1,)
        assert "lz" not in watch.state.running  # lazy: nothing runs before a request
        # The operator stages the next config and version; nothing loads them yet.
        write_config(root, "lz", width=8, lazy=True)
        (root / "lz" / "2").mkdir()
        answer = await client.infer("lz", X, version="1", timeout_s=60)
        assert answer.error is None
        assert answer.output("OUTPUT0").to_numpy().shape == (1, 4)
        assert watch.state.running["lz"].unit.versions == [1]
        assert await control.ready("lz", 1, mode="explicit")


async def test_a_pinned_version_gone_from_disk_fails_the_late_start(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    write_config(root, "gz", lazy=True)
    settings = following(make_settings(kafka_bootstrap, redis_url, unique_id, repository=root))
    async with serving(settings) as (watch, control), PlazaClient(settings) as client:
        await control.load("gz")
        entry = await control.table.get("gz")
        assert entry is not None and entry.pinned is not None
        (root / "gz" / "1").rename(root / "gz" / "3")  # its version 1 is gone
        await client.submit("gz", X)  # the request that starts the lazy unit

        async def reported() -> bool:
            now = await control.table.get("gz")
            return now is not None and bool(now.failed)

        await wait_for(reported, 60, "gz's late start to be refused in the table")
        assert watch.state.given_up["gz"] == entry.generation
        assert "gz" not in watch.state.running  # never switched to version 3
        refused = await control.table.get("gz")
        assert refused is not None and "version folder(s) 1 of model 'gz' are gone" in (
            refused.failed
        )


async def test_an_evicted_unit_comes_back_as_the_generation_that_served_after_a_refusal(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    write_config(root, "ma", nbytes=150_000_000)
    write_config(root, "mb", nbytes=250_000_000)
    base = make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)
    settings = following(base, memory_budget_bytes=350_000_000)
    async with serving(settings) as (watch, control), PlazaClient(settings) as client:
        await control.load("ma")
        served = watch.state.running["ma"].desired.generation
        write_config(root, "ma", latency="abc", nbytes=150_000_000)  # its backend refuses it
        with pytest.raises(ConfigError):
            await control.load("ma")
        await control.load("mb")  # no room for both: ma (idle) is evicted
        assert "ma" in watch.state.evicted
        await control.unload("mb")
        await wait_for(lambda: "mb" not in watch.state.running, 60, "mb's unit to stop")
        answer = await client.infer("ma", X, timeout_s=60)  # ma comes back on demand
        assert answer.error is None and answer.worker == "ph.ma"
        assert watch.state.running["ma"].desired.generation == served
        redis_client = redis.asyncio.Redis.from_url(settings.redis.url)
        try:
            assert await live_generations(redis_client, settings.names, "ma") == {served}
        finally:
            await redis_client.aclose()


async def test_readiness_reads_the_record_and_live_workers_not_the_folder(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    write_config(root, "rd")
    settings = following(make_settings(kafka_bootstrap, redis_url, unique_id, repository=root))
    async with serving(settings) as (_, control):
        await control.load("rd")
        assert await control.ready("rd", 1, mode="explicit")
        assert not await control.ready("rd", 2, mode="explicit")
        (root / "rd" / "config.pbtxt").write_text('name: "rd"\nmax_batch_size: [oops\n')
        assert await control.ready("rd", mode="explicit")  # a config mid-edit
        assert await control.ready("rd", 1, mode="explicit")
        write_config(root, "rd")
        (root / "rd" / "1").rename(root / "rd" / "3")  # a served version's folder renamed
        assert await control.ready("rd", 1, mode="explicit")
        assert not await control.ready("rd", 3, mode="explicit")
        await control.unload("rd")
        assert not await control.ready("rd", mode="explicit")
