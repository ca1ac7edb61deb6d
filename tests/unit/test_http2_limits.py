"""gateway/http2.py's ``paused``: a server whose writes are held back reads no more frames
(each could make an answer to queue), and reads those it held once it goes on."""

from __future__ import annotations

import hpack

from plaza.gateway import http2
from tests.unit.test_http2 import REQUEST, frames, opened


def test_a_paused_connection_leaves_frames_unread_until_it_goes_on() -> None:
    conn, events = opened()
    encoder = hpack.Encoder()
    flags = http2.END_HEADERS | http2.END_STREAM
    calls = [http2.frame(http2.HEADERS, flags, sid, encoder.encode(REQUEST)) for sid in (1, 3, 5)]
    pings = http2.frame(http2.PING, 0, 0, b"12345678") * 2
    cut = len(calls[0]) + 4
    wire = b"".join(calls)
    conn.receive(wire[:cut])  # the first call whole, the second cut
    assert [(kind, sid) for kind, sid, _ in events.got] == [("request", 1)]
    conn.paused = True  # as the server's pause_writing sets it
    conn.receive(wire[cut:] + pings)
    assert [(kind, sid) for kind, sid, _ in events.got] == [("request", 1)]
    assert conn.out == b""  # no PING answered while paused
    conn.paused = False
    conn.receive(b"")
    assert [(kind, sid) for kind, sid, _ in events.got] == [
        ("request", 1), ("request", 3), ("request", 5)
    ]  # fmt: skip
    assert frames(conn.out) == [(http2.PING, http2.ACK, 0, b"12345678")] * 2
