"""A gateway whose start fails half-way releases what it had started.

Real Kafka (the request producer starts), Redis out of reach (a closed loopback port): the
start fails on the reply stream, after the producer, and the service must be stopped.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from plaza.errors import Unavailable
from plaza.gateway.main import serving
from plaza.gateway.service import GatewayService
from tests.support import make_settings

SIMULATED = """
name: "simulated"
backend: "plaza_simulated"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


async def test_a_failed_start_stops_the_service(
    kafka_bootstrap: str, unique_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "simulated" / "1").mkdir(parents=True)
    (tmp_path / "simulated" / "config.pbtxt").write_text(SIMULATED)
    real_stop = GatewayService.stop
    producers_at_stop: list[object] = []

    async def stop(service: GatewayService) -> None:
        producers_at_stop.append(service._producer)
        await real_stop(service)

    monkeypatch.setattr(GatewayService, "stop", stop)
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        redis_url = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
        settings = make_settings(
            kafka_bootstrap, redis_url, unique_id, repository=tmp_path, gateway={"metrics_port": -1}
        )
        with pytest.raises(Unavailable, match="Redis"):
            async with serving(settings):
                raise AssertionError("the gateway served without Redis")
    assert len(producers_at_stop) == 1
    assert producers_at_stop[0] is not None  # the Kafka producer had started: now stopped
