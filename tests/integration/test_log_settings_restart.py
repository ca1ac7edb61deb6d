"""Triton's logging extension across processes and restarts, on a real Kafka and Redis: a
change names only its own settings (a worker started at DEBUG stays at DEBUG when the log
format changes), and a process started after a change starts from its own ``log_level``
while the processes that were running keep the change.

The gateways and the worker run in this test's process, so the settings land on its root
logger: the fixture puts the root logger back as it found it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker, wait_for


@pytest.fixture
def root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    level, formatters = root.level, [h.formatter for h in root.handlers]
    filters = [list(h.filters) for h in root.handlers]
    try:
        yield
    finally:
        root.setLevel(level)
        for handler, formatter, kept in zip(root.handlers, formatters, filters, strict=False):
            handler.setFormatter(formatter)
            handler.filters[:] = kept


@pytest.mark.usefixtures("root_logger_restored")
async def test_a_change_of_one_setting_keeps_each_process_s_others(
    settings: PlazaSettings,
) -> None:
    debug = settings.model_copy(update={"log_level": "DEBUG"})
    async with (
        running_worker(debug, "identity") as worker,
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, timeout=60) as client,
    ):
        answer = await client.post("/v2/logging", json={"log_format": "ISO8601"})
        await wait_for(
            lambda: worker.log_settings.current.log_format == "ISO8601",
            what="the worker to follow the change on its heartbeat",
        )
    assert answer.status_code == 200
    assert (answer.json()["log_verbose_level"], answer.json()["log_info"]) == (0, True)
    followed = worker.log_settings.current
    assert followed.log_verbose_level == 1 and followed.level == logging.DEBUG


@pytest.mark.usefixtures("root_logger_restored")
async def test_a_restarted_process_starts_from_its_flags(settings: PlazaSettings) -> None:
    async with running_worker(settings, "identity") as running:
        async with gateway_fronts(settings) as gw, httpx.AsyncClient(timeout=60) as client:
            loud = await client.post(f"{gw.http_url}/v2/logging", json={"log_verbose_level": 3})
        # the gateway restarts with --log-level WARNING; the worker keeps running
        warning = settings.model_copy(update={"log_level": "WARNING"})
        async with gateway_fronts(warning) as gw, httpx.AsyncClient(timeout=60) as client:
            restarted = (await client.get(f"{gw.http_url}/v2/logging")).json()
            later = await client.post(f"{gw.http_url}/v2/logging", json={"log_format": "ISO8601"})
            await wait_for(
                lambda: running.log_settings.current.log_format == "ISO8601",
                what="the running worker to follow both changes",
            )
    assert loud.status_code == 200 and later.status_code == 200
    assert restarted["log_verbose_level"] == 0  # the change made before it started is not its
    assert (restarted["log_info"], restarted["log_warnings"]) == (False, True)
    assert later.json()["log_format"] == "ISO8601" and later.json()["log_verbose_level"] == 0
    assert running.log_settings.current.log_verbose_level == 3  # it was running: it keeps it
