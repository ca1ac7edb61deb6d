"""Triton's logging extension through a gateway and a worker on a real Kafka and Redis:
tritonclient changes the log settings over HTTP, reads them back over gRPC, and the worker
(another part of the deployment) follows them on its heartbeat.

The gateway and the worker run in this test's process, so the settings land on its root
logger: the fixture puts the root logger back as it found it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

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
