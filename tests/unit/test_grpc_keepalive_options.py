"""gRPC keepalive and ping policy from the gateway's settings (Triton's --grpc-keepalive-*
and --grpc-http2-* flags): grpc.aio's server options, and the TCP keepalive timing of the
gateway's own server, which sends no pings (its limits on a client's pings are in
tests/unit/test_http2_pings.py)."""

from __future__ import annotations

import socket

from plaza.gateway.grpc_front import server_options
from plaza.gateway.grpc_server import KEEPALIVE, tcp_keepalive
from plaza.settings import GatewaySettings, PlazaSettings


def test_the_keepalive_settings_become_grpcio_server_options() -> None:
    gateway = GatewaySettings(
        max_body_bytes=1 << 20,
        grpc_keepalive_time_ms=3000,
        grpc_keepalive_timeout_ms=4000,
        grpc_keepalive_permit_without_calls=True,
        grpc_http2_max_pings_without_data=0,
        grpc_http2_min_recv_ping_interval_without_data_ms=500,
        grpc_http2_max_ping_strikes=7,
    )
    options = dict(server_options(PlazaSettings(gateway=gateway)))
    assert options == {
        "grpc.max_receive_message_length": 1 << 20,
        "grpc.max_send_message_length": 64 << 20,
        "grpc.keepalive_time_ms": 3000,
        "grpc.keepalive_timeout_ms": 4000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 500,
        "grpc.http2.max_ping_strikes": 7,
        "grpc.so_reuseport": 0,  # one gateway process: its port is its own
    }


def test_the_defaults_are_tritons() -> None:
    options = dict(server_options(PlazaSettings()))
    assert options["grpc.keepalive_time_ms"] == 7_200_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert options["grpc.http2.max_pings_without_data"] == 2
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 300_000
    assert options["grpc.http2.max_ping_strikes"] == 2


def test_the_plaza_servers_tcp_keepalive_follows_the_keepalive_time_and_timeout() -> None:
    gateway = GatewaySettings()
    default = tcp_keepalive(gateway.grpc_keepalive_time_ms, gateway.grpc_keepalive_timeout_ms)
    assert default == KEEPALIVE  # 2 h idle, probes 20 s apart, as before the settings
    assert dict(tcp_keepalive(1500, 1000)) == {
        socket.TCP_KEEPIDLE: 2,  # whole seconds, rounded up
        socket.TCP_KEEPINTVL: 1,
        socket.TCP_KEEPCNT: 3,
    }
    assert dict(tcp_keepalive(10**9, 10**9))[socket.TCP_KEEPIDLE] == 32767  # Linux's most
