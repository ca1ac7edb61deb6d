"""Triton's logging extension through a gateway and a worker on a real Kafka and Redis:
tritonclient changes the log settings over HTTP, reads them back over gRPC, and the worker
(another part of the deployment) follows them on its heartbeat.

The gateway and the worker run in this test's process, so the settings land on its root
logger: the fixture puts the root logger back as it found it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker


@pytest.fixture
def root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    level, formatters = root.level, [h.formatter for h in root.handlers]
    try:
        yield
    finally:
        root.setLevel(level)
        for handler, formatter in zip(root.handlers, formatters, strict=False):
            handler.setFormatter(formatter)


@pytest.mark.usefixtures("root_logger_restored")
async def test_log_settings_change_for_the_whole_deployment(settings: PlazaSettings) -> None:
    async with running_worker(settings, "identity") as worker, gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
        try:
            before = await http.get_log_settings()
            changed = await http.update_log_settings(
                {"log_verbose_level": 2, "log_format": "ISO8601"}
            )
            over_grpc = await grpc.get_log_settings(as_json=True)
            assert logging.getLogger().level == logging.DEBUG  # the gateway applied them
            for _ in range(100):  # the worker's next heartbeats (0.5 s apart here)
                if worker.log_settings.current.log_verbose_level == 2:
                    break
                await asyncio.sleep(0.1)
            followed = worker.log_settings.current
            with pytest.raises(InferenceServerException, match="log_file"):
                await http.update_log_settings({"log_file": "/tmp/plaza.log"})
            with pytest.raises(InferenceServerException, match="unknown log setting"):
                await grpc.update_log_settings({"log_level": True})
            assert "logging" in (await http.get_server_metadata())["extensions"]
        finally:
            await http.close()
            await grpc.close()
    assert before == {
        "log_file": "",
        "log_info": True,
        "log_warnings": True,
        "log_errors": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    assert changed == {**before, "log_verbose_level": 2, "log_format": "ISO8601"}
    settings_by_grpc = over_grpc["settings"]
    assert settings_by_grpc["log_verbose_level"] == {"uint32_param": 2}
    assert settings_by_grpc["log_format"] == {"string_param": "ISO8601"}
    assert (followed.log_verbose_level, followed.log_format) == (2, "ISO8601")


CHANGES = {
    "log_info": False,
    "log_warnings": False,
    "log_errors": False,
    "log_verbose_level": 3,
    "log_format": "ISO8601",
}
"""Five changes of five different settings, made at once."""
DEFAULTS = {
    "log_info": True,
    "log_warnings": True,
    "log_errors": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


@pytest.mark.usefixtures("root_logger_restored")
async def test_concurrent_changes_through_two_gateways_all_land(settings: PlazaSettings) -> None:
    """Each change reads the stored settings, changes one and stores them all: without a
    lock in a gateway and a compare-and-set across gateways, the last store would undo the
    changes stored between its read and its write."""
    async with gateway_fronts(settings) as a, gateway_fronts(settings) as b:
        gateways = (a, b)
        await asyncio.gather(
            *(
                gateways[i % 2].service.update_log_settings({name: value})
                for i, (name, value) in enumerate(CHANGES.items())
            )
        )
        stored = [dataclasses.asdict(await gw.service.get_log_settings()) for gw in gateways]
        async with httpx.AsyncClient() as client:  # again, through the HTTP fronts
            await client.post(f"{a.http_url}/v2/logging", json=DEFAULTS)
            answers = await asyncio.gather(
                *(
                    client.post(f"{gateways[i % 2].http_url}/v2/logging", json={name: value})
                    for i, (name, value) in enumerate(CHANGES.items())
                )
            )
            over_http = (await client.get(f"{b.http_url}/v2/logging")).json()
    for each in stored:
        assert {name: each[name] for name in CHANGES} == CHANGES
    assert [r.status_code for r in answers] == [200] * len(CHANGES)
    assert {name: over_http[name] for name in CHANGES} == CHANGES


@pytest.mark.usefixtures("root_logger_restored")
async def test_a_null_setting_is_left_as_it_is(settings: PlazaSettings) -> None:
    """As Triton: a null over HTTP, a setting with no value over gRPC (tritonclient's None
    both ways), changes nothing and is no error."""
    async with gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
        try:
            await http.update_log_settings({"log_verbose_level": 2})
            by_http = await http.update_log_settings(
                {"log_info": None, "log_verbose_level": None, "log_file": None}
            )
            by_grpc = await grpc.update_log_settings(
                {"log_info": None, "log_format": None}, as_json=True
            )
        finally:
            await http.close()
            await grpc.close()
    assert (by_http["log_verbose_level"], by_http["log_info"], by_http["log_file"]) == (2, True, "")
    answered = by_grpc["settings"]
    assert answered["log_verbose_level"] == {"uint32_param": 2}
    assert answered["log_info"] == {"bool_param": True}
    assert answered["log_format"] == {"string_param": "default"}
