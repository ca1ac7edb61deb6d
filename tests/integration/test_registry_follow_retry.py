"""A gateway following the model table reads a model again when its read failed (the model
folder still being copied to a shared disk, say), on real Kafka and Redis without workers.

Gateway ``a`` loads; gateway ``b`` follows with a clock of the test's own, so that when its
next read is due is decided by the test, not by waiting. What ``b`` reads of the model is
broken by writing a config that cannot be parsed after ``a`` loaded it, and mended by
writing the good one back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import plaza.gateway.registry as registry_module
import plaza.model_control as model_control
from plaza.errors import ConfigError
from plaza.gateway.registry import FOLLOW_INTERVAL_S, FOLLOW_RETRY_MAX_S, ModelRegistry
from plaza.settings import PlazaSettings
from tests.support import explicit_sim_settings, wait_for
from tests.unit.test_registry import _ensemble

pytestmark = pytest.mark.timeout(120)

BROKEN = "max_batch_size: {"


class Clock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Starter = Callable[..., Awaitable[ModelRegistry]]


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit on this test's prefixes; ``sim`` (a simulated model, every version
    served) in a repository of its own, nothing loaded at start."""
    return explicit_sim_settings(kafka_bootstrap, redis_url, unique_id, tmp_path)


@pytest.fixture
def gateways(settings: PlazaSettings, redis_client: aioredis.Redis) -> Starter:
    """Starts gateways' registries on the one model table."""

    async def started(clock: Clock | None = None) -> ModelRegistry:
        registry = ModelRegistry(settings, clock=clock or Clock())
        registry.read_start_models()
        await registry.start(redis_client)
        return registry

    return started


class Folder:
    """``sim``'s folder, as the following gateway sees it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "config.pbtxt"
        self.good = self.config.read_text()

    def breaks(self, text: str = BROKEN) -> None:
        """Its config cannot be read (a copy of it under way)."""
        self.config.write_text(text)

    def mend(self) -> None:
        self.config.write_text(self.good)

    def add_version(self, version: int) -> None:
        (self.root / str(version)).mkdir()


@pytest.fixture
def folder(settings: PlazaSettings) -> Folder:
    return Folder(Path(settings.repository) / "sim")


def versions(registry: ModelRegistry) -> tuple[int, ...] | None:
    """The versions of ``sim`` the gateway serves (None: it serves none)."""
    model = registry.models.get("sim")
    return None if model is None else model.versions


class Reads:
    """When (on ``clock``) each read of a model that a following gateway made took place."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.times: list[float] = []


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    made = Reads(Clock())
    read = model_control.read_model

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.times.append(made.clock())
        return read(*args, **kwargs)

    monkeypatch.setattr(registry_module, "read_model", counted)
    return made


def error_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == registry_module.__name__
    ]


# -- a failed read is tried again ------------------------------------------------------------


async def test_a_model_that_could_not_be_read_is_read_again_when_its_wait_is_over(
    gateways: Starter, folder: Folder
) -> None:
    clock = Clock()
    a, b = await gateways(), await gateways(clock)
    await a.load("sim")
    folder.breaks()  # b sees the folder mid-copy

    await b.follow()
    assert versions(b) is None
    assert "config.pbtxt" in b.failed["sim"]
    [row] = [row for row in b.index({}) if row.name == "sim"]
    assert row.state == "UNAVAILABLE" and row.reason == b.failed["sim"]

    folder.mend()
    await b.follow()  # too soon: it waits
    assert versions(b) is None

    clock.now += FOLLOW_INTERVAL_S
    await b.follow()
    assert versions(b) == (1,)
    assert "sim" not in b.failed
    assert [row.state for row in b.index({}) if row.name == "sim"] == ["LOADING"]


async def test_a_served_model_keeps_its_config_and_waits_longer_after_each_failure(
    gateways: Starter, folder: Folder, reads: Reads, caplog: pytest.LogCaptureFixture
) -> None:
    """The wait doubles from the follow interval (1 s) up to FOLLOW_RETRY_MAX_S (30 s); an
    error is logged once, a new one again."""
    clock = reads.clock
    a, b = await gateways(), await gateways(clock)
    await a.load("sim")
    await b.follow()
    folder.add_version(2)  # a new version folder, then a reload through a
    await a.load("sim")
    folder.breaks()
    reads.times.clear()
    caplog.set_level(logging.ERROR, logger=registry_module.__name__)

    start = clock.now
    for _ in range(100):
        await b.follow()
        clock.now += 1
    assert [t - start for t in reads.times] == [0, 1, 3, 7, 15, 31, 61, 91]
    assert versions(b) == (1,)  # its previous config, still served
    [row] = [row for row in b.index({"sim": 1}) if row.name == "sim"]
    assert row.state == "READY" and "serves its previous config" in row.reason
    assert len(error_logs(caplog)) == 1

    folder.breaks("max_batch_size: [")  # another error: logged once more
    clock.now = reads.times[-1] + FOLLOW_RETRY_MAX_S
    await b.follow()
    assert len(error_logs(caplog)) == 2

    folder.mend()
    clock.now += FOLLOW_RETRY_MAX_S
    await b.follow()
    assert versions(b) == (1, 2)
    assert "sim" not in b.failed
    assert [row.reason for row in b.index({"sim": 1}) if row.name == "sim"] == ["", ""]


async def test_a_new_load_is_read_at_once_and_an_unload_ends_the_failure(
    gateways: Starter, folder: Folder
) -> None:
    clock = Clock()
    a, b = await gateways(), await gateways(clock)
    await a.load("sim")
    folder.breaks()
    await b.follow()
    assert "sim" in b.failed

    folder.mend()
    await a.load("sim")  # a new generation: no wait for it
    await b.follow()
    assert versions(b) == (1,)
    assert "sim" not in b.failed

    folder.add_version(2)
    await a.load("sim")
    folder.breaks()
    await b.follow()
    assert "sim" in b.failed and "sim" in b.models
    await a.unload("sim")
    await b.follow()
    assert "sim" not in b.failed and "sim" not in b.models
    assert [row.reason for row in b.index({}) if row.name == "sim"] == ["unloaded"]


# -- a load through the same gateway during a follow's read ----------------------------------


async def test_a_load_through_this_gateway_while_a_follow_reads_the_model_stands(
    settings: PlazaSettings, gateways: Starter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's follow reads ``sim`` as a loaded it; meanwhile a unloads it and b loads an
    ensemble that calls it (so b marks ``sim`` loaded again, as a step, under the
    ensemble's lock). The follow's read then fails: what b's load wrote stands, and no
    failure is left behind that no later round would clear."""
    _ensemble(Path(settings.repository), "ens", "sim")
    entered, opened = threading.Event(), threading.Event()
    read = model_control.read_model

    def held(*args: Any, **kwargs: Any) -> Any:
        if not opened.is_set():
            entered.set()
            opened.wait(60)
            raise ConfigError("the folder is being copied")
        return read(*args, **kwargs)

    monkeypatch.setattr(registry_module, "read_model", held)
    clock = Clock()
    a, b = await gateways(), await gateways(clock)
    await a.load("sim")
    following = asyncio.create_task(b.follow())
    try:
        await wait_for(entered.is_set, 30, "b's follow to read sim")
        await a.unload("sim")
        await b.load("ens")
    finally:
        opened.set()
    await following
    clock.now += FOLLOW_RETRY_MAX_S  # any wait for a read again is over
    await b.follow()
    assert {"ens", "sim"} <= set(b.models)
    assert b.failed == {}
