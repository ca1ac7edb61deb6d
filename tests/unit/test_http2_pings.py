"""gateway/http2.py's ``PingPolicy``: a client's pings counted as grpc-core's servers count
them (strikes for pings too close together, GOAWAY too_many_pings past the limit), on a
clock of the test's own."""

from __future__ import annotations

import hpack
import pytest

from plaza.gateway import http2
from tests.unit.test_http2 import REQUEST, Events, frames

PING = http2.frame(http2.PING, 0, 0, b"12345678")
PONG = (http2.PING, http2.ACK, 0, b"12345678")


class Clock:
    """The connection's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def opened(policy: http2.PingPolicy | None) -> tuple[http2.Connection, Clock]:
    clock = Clock()
    conn = http2.Connection(Events(), max_streams=8, window=1 << 16, pings=policy, clock=clock)
    conn.receive(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
    conn.out.clear()
    return conn, clock


def open_stream(conn: http2.Connection, stream_id: int = 1) -> None:
    block = hpack.Encoder().encode(REQUEST)
    conn.receive(http2.frame(http2.HEADERS, http2.END_HEADERS, stream_id, block))


def pings(conn: http2.Connection, clock: Clock, *gaps: float) -> None:
    """A ping after each gap (seconds); each must be answered."""
    for gap in gaps:
        clock.now += gap
        conn.out.clear()
        conn.receive(PING)
        assert frames(conn.out) == [PONG]


def struck_out(conn: http2.Connection) -> None:
    with pytest.raises(http2.ConnectionError_) as exc:
        conn.receive(PING)
    assert (exc.value.code, str(exc.value)) == (http2.ENHANCE_YOUR_CALM, "too_many_pings")


def test_pings_too_close_on_an_open_stream_are_struck_out_past_the_limit() -> None:
    conn, clock = opened(http2.PingPolicy(min_interval_s=10, max_strikes=2))
    open_stream(conn)
    pings(conn, clock, 0, 10, 20)  # the interval apart, or more: no strike
    assert conn.ping_strikes == 0
    pings(conn, clock, 9.5, 1)  # two strikes: the limit, not past it
    assert conn.ping_strikes == 2
    struck_out(conn)


def test_without_calls_pings_need_two_hours_unless_permitted() -> None:
    conn, clock = opened(http2.PingPolicy(min_interval_s=10, max_strikes=1))
    pings(conn, clock, 0, 2 * 3600)  # no stream: two hours apart are allowed
    pings(conn, clock, 3600)  # an hour: a strike, though over min_interval_s
    assert conn.ping_strikes == 1
    clock.now += 3600
    struck_out(conn)

    permitted = http2.PingPolicy(min_interval_s=10, max_strikes=1, permit_without_calls=True)
    conn, clock = opened(permitted)
    pings(conn, clock, 0, 10, 10, 10)
    assert conn.ping_strikes == 0


def test_headers_or_data_sent_clear_the_strikes() -> None:
    conn, clock = opened(http2.PingPolicy(min_interval_s=10, max_strikes=1))
    open_stream(conn)
    pings(conn, clock, 0, 1)
    assert conn.ping_strikes == 1
    conn.send_headers(1, http2.literal(b":status", b"200"))
    assert conn.ping_strikes == 0
    pings(conn, clock, 1, 1)  # the first after sending is no strike, the next one is
    assert conn.ping_strikes == 1
    conn.send_data(1, memoryview(b"answer"))
    pings(conn, clock, 1, 1)
    assert conn.ping_strikes == 1
    struck_out(conn)


def test_no_limit_with_zero_strikes_or_no_policy() -> None:
    for policy in (http2.PingPolicy(min_interval_s=10, max_strikes=0), None):
        conn, clock = opened(policy)
        pings(conn, clock, *[0.0] * 50)
