"""The server side of HTTP/2 (RFC 9113), as much of it as gRPC's calls use: frames in,
stream events out, frames to write. No I/O here; ``gateway/grpc_server.py`` drives it.

Why not h2 (the HTTP/2 state machine on PyPI): serving gRPC on h2 cost the gateway about
100 µs of CPU per call in h2's own Python (its per-frame validation, its event objects, its
header encoder), a third of the gateway's busy time under load (docs/benchmarks.md, "The
gateway's own gRPC server"). This layer does per frame only what the protocol needs:

- the client's preface, SETTINGS (acknowledged; its INITIAL_WINDOW_SIZE moves every open
  stream's window, MAX_FRAME_SIZE bounds what is sent), PING (answered; with a
  ``PingPolicy``, grpc-core's servers' ping strikes, below), GOAWAY, PRIORITY
  (ignored), WINDOW_UPDATE, RST_STREAM, and unknown frame types (ignored, as the RFC asks);
- HEADERS with CONTINUATION, padding and priority fields, decoded by HPACK (the ``hpack``
  package's decoder: it keeps the client's dynamic table; a block the decoder would read
  the same way again, as a client's every call sends once its headers are in the table,
  is not decoded again); DATA with padding;
- flow control both ways: what may be sent is the smaller of the connection's and the
  stream's window; what is received is counted against the windows this side granted
  (a peer past them is a FLOW_CONTROL_ERROR), and given back by ``give_back`` in batches;
- at most ``max_streams`` open streams (past it a new one is refused, REFUSED_STREAM);
- ``paused``: frames received stay unread in the buffer until it is cleared and
  ``receive`` called again (a server whose writes are held back answers nothing more).

Headers are sent as HPACK literals that never touch the dynamic table (``literal``), so the
encoder keeps no state, and a response's constant headers are encoded once.

Pings, with a ``PingPolicy`` (Triton's ``--grpc-http2-min-recv-ping-interval-without-data``,
``--grpc-http2-max-ping-strikes`` and ``--grpc-keepalive-permit-without-calls``), as
grpc-core's servers count them: a ping that comes sooner than ``min_interval_s`` after the
one before is a strike (sooner than 2 hours while no stream is open, unless
``permit_without_calls``); the first ping after this side sent headers or data is never
one, and sending them clears the strikes. Past ``max_strikes`` strikes (0: no limit) the
connection ends: GOAWAY ENHANCE_YOUR_CALM with debug data ``too_many_pings``. Without a
policy every ping is answered, at any rate.

A protocol error raises ``ConnectionError_`` (send GOAWAY with its code, then close); an
error confined to one stream resets that stream and tells the handler.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE = 0, 1, 2, 3, 4, 5
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 6, 7, 8, 9
# flags
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
# settings
HEADER_TABLE_SIZE, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x1, 0x3, 0x4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x5, 0x6

DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_WINDOW = (1 << 31) - 1
RECEIVE_FRAME = 1 << 20
"""The largest frame this side accepts (its SETTINGS_MAX_FRAME_SIZE)."""
MAX_HEADER_BLOCK = 1 << 20
"""The most a request's header block may take, CONTINUATIONs included."""

_HEAD = struct.Struct(">IBI")  # a frame's header read as (length << 8 | type), flags, stream
_SETTING = struct.Struct(">HI")


IDLE_PING_INTERVAL_S = 2 * 3600.0
"""The least time between a client's pings while no stream is open and the policy does
not permit pings without calls (grpc-core's)."""
TOO_MANY_PINGS = "too_many_pings"
"""The debug data of the GOAWAY that ends a connection past its ping strikes."""


@dataclass(frozen=True, slots=True)
class PingPolicy:
    """How often a client may ping (grpc-core's ping abuse policy, with Triton's flags)."""

    min_interval_s: float = 300.0
    """Pings closer than this are strikes (Triton's
    --grpc-http2-min-recv-ping-interval-without-data, in seconds)."""
    max_strikes: int = 2
    """Past this many strikes the connection ends (0: no limit)."""
    permit_without_calls: bool = False
    """Whether ``min_interval_s`` holds while no stream is open, too (else 2 hours do)."""


_TableMark = tuple[int, "tuple[bytes, bytes] | None"]
"""The decoder's dynamic table, as ``Connection._decode`` tells its changes: the number of
entries and the front entry."""


def _same(a: _TableMark, b: _TableMark) -> bool:
    return a[0] == b[0] and a[1] is b[1]


class ConnectionError_(Exception):
    """A connection-level protocol error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Handler(Protocol):
    """What a connection tells its user about the streams."""

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        """A new stream's request headers (``ended``: no body follows)."""

    def on_data(self, stream_id: int, data: bytes, flow_length: int, ended: bool) -> None:
        """Body bytes of an open stream (``flow_length`` counts its padding too)."""

    def on_end(self, stream_id: int) -> None:
        """The client ended its side of the stream with trailers (no more data)."""

    def on_reset(self, stream_id: int) -> None:
        """The stream is gone: the client reset it, or this side did on an error."""

    def on_window(self, stream_id: int) -> None:
        """More may be sent on ``stream_id`` (0: on every stream)."""


@dataclass(slots=True)
class _Stream:
    send_window: int
    receive_window: int
    unacknowledged: int = 0


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, header and payload."""
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """HPACK's integer, its first byte's high bits ``first``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header as an HPACK literal without indexing, with a literal name (no Huffman)."""
    return b"\x00" + _integer(len(name), 7, 0) + name + _integer(len(value), 7, 0) + value


class Connection:
    """The server side of one HTTP/2 connection. ``receive`` bytes, read ``out``."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_streams: int,
        window: int,
        pings: PingPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handler = handler
        self.pings = pings
        """The client's pings' limits (None: every ping is answered, at any rate)."""
        self._clock = clock
        self._last_ping = -math.inf  # when the client last pinged, since this side last sent
        self.ping_strikes = 0
        self.max_streams = max_streams
        self.window = window  # granted to each stream and to the connection
        self.out = bytearray()  # frames to write
        self.streams: dict[int, _Stream] = {}
        self.last_stream_id = 0  # the highest stream the client opened
        self._buffer = bytearray()
        self.started = False  # the client's preface has come
        self.paused = False
        """While set, ``receive`` reads no more frames: they wait in the buffer (the user's
        writes are held back, so that what frames would answer is not queued in memory)."""
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_BLOCK
        self._send_window = DEFAULT_WINDOW  # the connection's, granted by the client
        self._receive_window = max(window, DEFAULT_WINDOW)  # as the preamble grows it
        self._unacknowledged = 0
        self._initial_send = DEFAULT_WINDOW  # the client's INITIAL_WINDOW_SIZE
        self.max_send_frame = DEFAULT_FRAME
        self._continued: tuple[int, int, bytearray] | None = None  # stream, flags, block
        self._remembered: tuple[bytes, _TableMark, list[tuple[bytes, bytes]]] | None = None
        """The last header block that left the decoder's table as it found it, the table's
        mark then, and the headers it decoded to (``_decode``)."""

    def preamble(self) -> None:
        """This side's SETTINGS and the connection's window grown to ``window``."""
        settings = b"".join(
            _SETTING.pack(k, v)
            for k, v in (
                (MAX_CONCURRENT_STREAMS, self.max_streams),
                (INITIAL_WINDOW_SIZE, self.window),
                (MAX_FRAME_SIZE, RECEIVE_FRAME),
                (MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
            )
        )
        self.out += frame(SETTINGS, 0, 0, settings)
        if self.window > DEFAULT_WINDOW:
            self.out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.window - DEFAULT_WINDOW))

    # -- receiving -----------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        """Take bytes from the client; the handler hears of what they complete (what is
        left while ``paused`` is read by the next call, ``receive(b"")`` at the least)."""
        buf = self._buffer
        buf += data
        if not self.started:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(bytes(buf)):
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buf[: len(PREFACE)] != PREFACE:
                raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del buf[: len(PREFACE)]
            self.started = True
        at = 0
        end = len(buf)
        while end - at >= 9 and not self.paused:
            head, flags, stream_id = _HEAD.unpack_from(buf, at)
            length, kind = head >> 8, head & 0xFF
            if length > RECEIVE_FRAME:
                raise ConnectionError_(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if end - at - 9 < length:
                break
            payload = bytes(buf[at + 9 : at + 9 + length])
            at += 9 + length
            self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
        del buf[:at]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continued is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise ConnectionError_(PROTOCOL_ERROR, "a malformed RST_STREAM")
            if self.streams.pop(stream_id, None) is not None:
                self.handler.on_reset(stream_id)
        elif kind == SETTINGS:
            if stream_id != 0 or len(payload) % 6 or (flags & ACK and payload):
                raise ConnectionError_(PROTOCOL_ERROR, "a malformed SETTINGS")
            if not flags & ACK:
                self._settings(payload)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR, "a malformed PING")
            if not flags & ACK:
                if self.pings is not None:
                    self._count_ping(self.pings)
                self.out += frame(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            pass  # the client sends nothing new; its calls in flight are answered
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown types: ignored

    def _count_ping(self, policy: PingPolicy) -> None:
        """A strike for a ping too soon after the one before; past the policy's strikes,
        ConnectionError_ ENHANCE_YOUR_CALM."""
        now = self._clock()
        idle = not self.streams and not policy.permit_without_calls
        interval = IDLE_PING_INTERVAL_S if idle else policy.min_interval_s
        allowed, self._last_ping = self._last_ping + interval, now
        if allowed <= now:
            return
        self.ping_strikes += 1
        if policy.max_strikes and self.ping_strikes > policy.max_strikes:
            raise ConnectionError_(ENHANCE_YOUR_CALM, TOO_MANY_PINGS)

    def _sent(self) -> None:
        """Headers or data went out: the client's ping strikes start over (grpc-core's)."""
        self.ping_strikes = 0
        self._last_ping = -math.inf

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, i)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta, self._initial_send = value - self._initial_send, value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.max_send_frame = value
            elif key == HEADER_TABLE_SIZE:
                pass  # this side's encoder uses no dynamic table
        self.out += frame(SETTINGS, ACK, 0)
        self.handler.on_window(0)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "padding past the frame")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        self._receive_window -= len(payload)
        if self._receive_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self._give_back_connection(len(payload))
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on a stream never opened")
            return  # a stream this side has ended or reset: its data is dropped
        stream.receive_window -= len(payload)
        if stream.receive_window < 0:
            self.reset(stream_id, FLOW_CONTROL_ERROR)
            return
        ended = bool(flags & END_STREAM)
        self.handler.on_data(stream_id, self._unpad(flags, payload), len(payload), ended)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(flags, stream_id, block)
        else:
            self._continued = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continued is None or self._continued[0] != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "an unexpected CONTINUATION")
        block = self._continued[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise ConnectionError_(PROTOCOL_ERROR, "a header block over 1 MiB")
        if flags & END_HEADERS:
            first_flags = self._continued[1]
            self._continued = None
            self._header_block(first_flags, stream_id, bytes(block))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        headers = self._decode(block)
        ended = bool(flags & END_STREAM)
        if stream_id in self.streams:  # trailers: the client's side ends
            if not ended:
                raise ConnectionError_(PROTOCOL_ERROR, "trailers without END_STREAM")
            self.handler.on_end(stream_id)
            return
        if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}")
        self.last_stream_id = stream_id
        if len(self.streams) >= self.max_streams:
            self.out += frame(RST_STREAM, 0, stream_id, struct.pack(">I", REFUSED_STREAM))
            return
        self.streams[stream_id] = _Stream(self._initial_send, self.window)
        self.handler.on_request(stream_id, headers, ended)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The headers of ``block``; every block goes through the decoder, whose table must
        follow the client's encoder, except one the decoder would read the same way again.

        hpack's decoder takes about 18 µs even for a block of indexed references alone, and
        a client whose headers are all in the table sends that same block for every call.
        A block's headers depend only on it and on the table's entries, so a block that
        changed no entry when it was decoded decodes the same while the entries stay as
        they were. They change only by an entry added at the front or entries dropped
        from the back, so the count and the front entry itself (held, so it cannot be
        another object later) tell whether they did."""
        mark = self._mark()
        known = self._remembered
        if known is not None and known[0] == block and _same(known[1], mark):
            return list(known[2])
        try:
            decoded = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"a header block: {exc}") from exc
        headers = cast("list[tuple[bytes, bytes]]", list(decoded))
        self._remembered = (block, mark, list(headers)) if _same(mark, self._mark()) else None
        return headers

    def _mark(self) -> _TableMark:
        entries = self._decoder.header_table.dynamic_entries
        return len(entries), entries[0] if entries else None

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            self._send_window += increment
            if increment == 0 or self._send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "a bad connection WINDOW_UPDATE")
            self.handler.on_window(0)
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.send_window += increment
            if increment == 0 or stream.send_window > MAX_WINDOW:
                self.reset(stream_id, FLOW_CONTROL_ERROR)
                return
            self.handler.on_window(stream_id)

    # -- flow control of what is received -------------------------------------------------
    def _give_back_connection(self, n: int) -> None:
        self._unacknowledged += n
        if self._unacknowledged >= self.window // 2:
            self._receive_window += self._unacknowledged
            self.out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._unacknowledged))
            self._unacknowledged = 0

    def give_back(self, stream_id: int, n: int) -> None:
        """``n`` bytes of the stream's body were consumed: the client may send as many
        more (a WINDOW_UPDATE once half its window is owed)."""
        stream = self.streams.get(stream_id)
        if stream is None or n <= 0:
            return
        stream.unacknowledged += n
        if stream.unacknowledged >= self.window // 2:
            stream.receive_window += stream.unacknowledged
            self.out += frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", stream.unacknowledged))
            stream.unacknowledged = 0

    # -- sending ---------------------------------------------------------------------------
    def send_headers(self, stream_id: int, block: bytes, end_stream: bool = False) -> None:
        """A header block (HPACK-encoded by the caller: ``literal``) in one HEADERS frame,
        or CONTINUATIONs past the client's frame size; ``end_stream`` ends the stream."""
        flags = END_STREAM if end_stream else 0
        self._sent()
        size = self.max_send_frame
        if len(block) <= size:
            self.out += frame(HEADERS, flags | END_HEADERS, stream_id, block)
        else:
            self.out += frame(HEADERS, flags, stream_id, block[:size])
            for i in range(size, len(block), size):
                last = END_HEADERS if i + size >= len(block) else 0
                self.out += frame(CONTINUATION, last, stream_id, block[i : i + size])
        if end_stream:
            self.streams.pop(stream_id, None)

    def sendable(self, stream_id: int) -> int:
        """How many body bytes may be sent on the stream now."""
        stream = self.streams.get(stream_id)
        return 0 if stream is None else max(min(self._send_window, stream.send_window), 0)

    def send_data(self, stream_id: int, data: memoryview) -> int:
        """Send as much of ``data`` as the windows allow now; returns how much."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return 0
        n = min(len(data), self._send_window, stream.send_window)
        if n <= 0:
            return 0
        self._sent()
        size = self.max_send_frame
        for i in range(0, n, size):
            chunk = data[i : min(i + size, n)]
            self.out += _HEAD.pack(len(chunk) << 8 | DATA, 0, stream_id)
            self.out += chunk
        self._send_window -= n
        stream.send_window -= n
        return n

    def reset(self, stream_id: int, code: int) -> None:
        """End the stream now with RST_STREAM ``code``; the handler hears of it."""
        self.out += frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))
        if self.streams.pop(stream_id, None) is not None:
            self.handler.on_reset(stream_id)

    def goaway(self, code: int, message: str = "") -> None:
        """GOAWAY: streams past ``last_stream_id`` will not be served."""
        payload = struct.pack(">II", self.last_stream_id, code) + message.encode()[:256]
        self.out += frame(GOAWAY, 0, 0, payload)
