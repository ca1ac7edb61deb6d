"""A gateway that cannot listen where it is told says so in one line (ConfigError; `plaza
gateway` exits 1 without a traceback), and a second gateway never shares the gRPC port of
another one: only the processes of one gateway (``gateway.workers`` > 1) share their ports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from plaza.errors import ConfigError
from plaza.gateway.main import serving
from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, loopback_socket


@contextmanager
def taken_port() -> Iterator[int]:
    """A 127.0.0.1 port that a plain (not SO_REUSEPORT) listening socket holds."""
    with loopback_socket() as holder:
        holder.listen()
        yield int(holder.getsockname()[1])


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.mark.parametrize("server", ["plaza", "grpcio"])
async def test_a_second_gateway_refuses_the_grpc_port_of_the_first(
    settings_for: Callable[..., PlazaSettings], server: str
) -> None:
    settings = settings_for("identity", host="127.0.0.1", grpc_server=server)
    async with gateway_fronts(settings) as first:
        port = _port_of(first.grpc_address)
        with loopback_socket() as http, pytest.raises(ConfigError) as caught:
            async with serving(settings, http_socket=http, grpc_port=port):
                pass
    assert f"the gRPC front cannot listen on 127.0.0.1:{port}" in caught.value.message


async def test_the_processes_of_one_gateway_share_its_grpc_port(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", host="127.0.0.1", workers=2)
    async with gateway_fronts(settings) as first:
        port = _port_of(first.grpc_address)
        with loopback_socket() as http:
            async with serving(settings, http_socket=http, grpc_port=port) as second:
                assert _port_of(second.grpc_address) == port


async def test_an_http_port_in_use_is_a_config_error(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    with taken_port() as port:
        settings = settings_for("identity", host="127.0.0.1", http_port=port)
        with pytest.raises(ConfigError) as caught:
            async with serving(settings, grpc_port=0):
                pass
    assert f"the HTTP front cannot listen on 127.0.0.1:{port}" in caught.value.message


async def test_an_unknown_host_is_a_config_error(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", host="no.such.host.invalid", http_port=0)
    with pytest.raises(ConfigError) as caught:
        async with serving(settings, grpc_port=0):
            pass
    assert "the HTTP front cannot listen on no.such.host.invalid:" in caught.value.message


@pytest.mark.parametrize("workers", [1, 2])
def test_plaza_gateway_reports_a_taken_port_in_one_line(
    settings_for: Callable[..., PlazaSettings], workers: int
) -> None:
    settings = settings_for("identity")
    env = {
        **os.environ,
        "PLAZA_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "PLAZA_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "PLAZA_REDIS__URL": settings.redis.url,
        "PLAZA_REDIS__KEY_PREFIX": settings.redis.key_prefix,
        "PLAZA_REPOSITORY": str(settings.repository),
    }
    with taken_port() as port:
        flags = ["--gateway.host", "127.0.0.1", "--gateway.http_port", str(port)]
        flags += ["--gateway.grpc_port", "0", "--gateway.metrics_port", "-1"]
        flags += ["--gateway.workers", str(workers)]
        done = subprocess.run(
            [sys.executable, "-m", "plaza.cli.main", "gateway", *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    errors = [line for line in done.stderr.splitlines() if line.startswith("plaza gateway:")]
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(
        f"plaza gateway: error: the HTTP front cannot listen on 127.0.0.1:{port}: "
    )
