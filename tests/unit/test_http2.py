"""gateway/http2.py, the server side of HTTP/2, fed frames by hand (HPACK by the hpack
package's encoder, as a client's)."""

from __future__ import annotations

import struct

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plaza.gateway import http2


class Events:
    """A handler that records what the connection tells it."""

    def __init__(self) -> None:
        self.got: list[tuple[str, int, object]] = []

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        self.got.append(("request", stream_id, (dict(headers), ended)))

    def on_data(self, stream_id: int, data: bytes, flow_length: int, ended: bool) -> None:
        self.got.append(("data", stream_id, (data, flow_length, ended)))

    def on_end(self, stream_id: int) -> None:
        self.got.append(("end", stream_id, None))

    def on_reset(self, stream_id: int) -> None:
        self.got.append(("reset", stream_id, None))

    def on_window(self, stream_id: int) -> None:
        self.got.append(("window", stream_id, None))


def frames(out: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``out``."""
    found, at = [], 0
    while at < len(out):
        length = int.from_bytes(out[at : at + 3], "big")
        kind, flags = out[at + 3], out[at + 4]
        stream = int.from_bytes(out[at + 5 : at + 9], "big")
        found.append((kind, flags, stream, bytes(out[at + 9 : at + 9 + length])))
        at += 9 + length
    return found


REQUEST = [(":method", "POST"), (":path", "/s/M"), ("te", "trailers"), ("x-long", "v" * 300)]


def opened(window: int = 1 << 16, max_streams: int = 8) -> tuple[http2.Connection, Events]:
    events = Events()
    conn = http2.Connection(events, max_streams=max_streams, window=window)
    conn.preamble()
    conn.out.clear()
    conn.receive(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
    conn.out.clear()
    events.got.clear()
    return conn, events


def test_preamble_settings_ping_and_a_bad_preface() -> None:
    events = Events()
    conn = http2.Connection(events, max_streams=8, window=1 << 20)
    conn.preamble()
    kinds = [f[0] for f in frames(conn.out)]
    assert kinds == [http2.SETTINGS, http2.WINDOW_UPDATE]
    conn.out.clear()
    conn.receive(http2.PREFACE[:10])  # a preface may arrive in pieces
    conn.receive(http2.PREFACE[10:] + http2.frame(http2.SETTINGS, 0, 0))
    conn.receive(http2.frame(http2.PING, 0, 0, b"12345678"))
    assert frames(conn.out) == [
        (http2.SETTINGS, http2.ACK, 0, b""),
        (http2.PING, http2.ACK, 0, b"12345678"),
    ]
    with pytest.raises(http2.ConnectionError_):
        http2.Connection(events, max_streams=8, window=1 << 20).receive(b"GET / HTTP/1.1\r\n")


def test_a_request_split_over_continuation_with_padded_data() -> None:
    conn, events = opened()
    block = hpack.Encoder().encode(REQUEST)
    padded = bytes([3]) + b"body" + b"\0\0\0"
    conn.receive(
        http2.frame(http2.HEADERS, 0, 1, block[:5])
        + http2.frame(http2.CONTINUATION, http2.END_HEADERS, 1, block[5:])
        + http2.frame(http2.DATA, http2.PADDED | http2.END_STREAM, 1, padded)
    )
    (kind, sid, (headers, ended)), data = events.got[0], events.got[1]  # type: ignore[misc]
    assert (kind, sid, ended) == ("request", 1, False)
    assert headers[b":path"] == b"/s/M" and headers[b"x-long"] == b"v" * 300
    assert data == ("data", 1, (b"body", len(padded), True))


def test_sends_wait_for_the_windows_and_settings_move_them() -> None:
    conn, events = opened()
    conn.receive(http2.frame(http2.HEADERS, http2.END_HEADERS, 1, hpack.Encoder().encode(REQUEST)))
    conn.out.clear()
    body = memoryview(b"x" * 70_000)
    sent = conn.send_data(1, body)
    assert sent == 65_535  # the client's default window, in frames of 16 KiB
    assert [len(f[3]) for f in frames(conn.out)] == [16384] * 3 + [65_535 - 3 * 16384]
    assert conn.send_data(1, body[sent:]) == 0
    conn.receive(http2.frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 10_000)))
    assert conn.sendable(1) == 0  # the stream's own window is still spent
    settings = struct.pack(">HI", http2.INITIAL_WINDOW_SIZE, 65_535 + 10_000)
    conn.receive(http2.frame(http2.SETTINGS, 0, 0, settings))
    assert conn.sendable(1) == 10_000
    assert ("window", 0, None) in events.got


def test_flow_control_errors_and_the_stream_limit() -> None:
    conn, events = opened(window=1 << 16, max_streams=1)
    encoder = hpack.Encoder()
    conn.receive(http2.frame(http2.HEADERS, http2.END_HEADERS, 1, encoder.encode(REQUEST)))
    conn.out.clear()
    conn.receive(http2.frame(http2.HEADERS, http2.END_HEADERS, 3, encoder.encode(REQUEST)))
    assert frames(conn.out) == [(http2.RST_STREAM, 0, 3, struct.pack(">I", http2.REFUSED_STREAM))]
    for _ in range(4):  # 4 x 16 KiB: the 64 KiB the stream was granted, and no more
        conn.receive(http2.frame(http2.DATA, 0, 1, b"x" * 16384))
    assert [e[0] for e in events.got] == ["request"] + ["data"] * 4
    conn.out.clear()
    conn.receive(http2.frame(http2.DATA, 0, 1, b"x" * 16384))  # nothing was given back
    assert events.got[-1] == ("reset", 1, None)
    assert frames(conn.out) == [
        (http2.RST_STREAM, 0, 1, struct.pack(">I", http2.FLOW_CONTROL_ERROR))
    ]
    with pytest.raises(http2.ConnectionError_) as never_opened:
        conn.receive(http2.frame(http2.DATA, 0, 9, b"x"))
    assert never_opened.value.code == http2.PROTOCOL_ERROR


def test_literals_round_trip_through_a_decoder() -> None:
    block = http2.literal(b"grpc-status", b"3") + http2.literal(b"grpc-message", b"m" * 200)
    assert hpack.Decoder().decode(block, raw=True) == [
        (b"grpc-status", b"3"),
        (b"grpc-message", b"m" * 200),
    ]


_FRAMES = st.tuples(
    st.integers(0, 10),  # every frame type, and one past CONTINUATION
    st.integers(0, 255),
    st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]),
    st.one_of(
        st.binary(max_size=64),
        st.builds(lambda h: hpack.Encoder().encode(h), st.just(REQUEST)),
        st.builds(struct.pack, st.just(">HI"), st.integers(0, 7), st.integers(0, 2**32 - 1)),
        st.builds(struct.pack, st.just(">I"), st.integers(0, 2**32 - 1)),
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAMES, max_size=12), st.integers(1, 40))
def test_any_frames_end_in_events_or_a_protocol_error_never_a_crash(
    sent: list[tuple[int, int, int, bytes]], chunk: int
) -> None:
    """A client's bytes, well-formed frames or not and cut anywhere, make stream events
    or a ConnectionError_ (GOAWAY): no other exception reaches the server's protocol."""
    conn, _ = opened()
    wire = b"".join(http2.frame(kind, flags, sid, payload) for kind, flags, sid, payload in sent)
    try:
        for at in range(0, len(wire), chunk):
            conn.receive(wire[at : at + chunk])
    except http2.ConnectionError_ as exc:
        assert exc.code in range(0x0, 0xE)


_HEADER_SETS = [
    REQUEST,
    [(":method", "POST"), (":path", "/s/M"), ("te", "trailers")],
    [(":method", "POST"), (":path", "/s/N"), ("grpc-timeout", "5S")],
    [(":method", "POST"), (":path", "/s/M"), ("x-big", "b" * 200)],  # evicts from a small table
]
_SENDS = st.one_of(
    st.sampled_from(range(len(_HEADER_SETS))),  # a header set, as the encoder would send it
    st.sampled_from([64, 256, 4096]).map(lambda size: -size),  # a table size update first
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_SENDS, min_size=1, max_size=30))
def test_header_blocks_decode_as_a_fresh_decoder_reads_them(sends: list[int]) -> None:
    """The blocks not decoded again (those that left the table as they found it) give what
    a decoder that reads every block gives, whatever came between them."""
    conn, events = opened(max_streams=100)
    client, reference = hpack.Encoder(), hpack.Decoder()
    stream = 1
    for send in sends:
        if send < 0:
            if client.header_table_size != -send:  # hpack's encoder loses a repeated one
                client.header_table_size = -send
            continue
        block = client.encode(_HEADER_SETS[send])
        conn.receive(
            http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, stream, block)
        )
        expected = dict(reference.decode(block, raw=True))
        assert events.got[-1] == ("request", stream, (expected, True))
        stream += 2


def test_a_block_that_changed_no_table_entry_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    conn, events = opened()
    client = hpack.Encoder()
    decoded: list[bytes] = []
    decode = conn._decoder.decode

    def counted(block: bytes, raw: bool) -> object:
        decoded.append(block)
        return decode(block, raw)

    monkeypatch.setattr(conn._decoder, "decode", counted)
    blocks = [client.encode(REQUEST) for _ in range(3)]  # the first adds entries, then indexes
    for i, block in enumerate(blocks):
        conn.receive(
            http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1 + 2 * i, block)
        )
    assert blocks[1] == blocks[2] != blocks[0]
    assert decoded == blocks[:2]
    assert [got[2] for got in events.got] == [
        (dict(hpack.Decoder().decode(blocks[0], raw=True)), True)
    ] * 3
