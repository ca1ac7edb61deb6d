"""The gateway's gRPC server: gRPC's calls over the gateway's HTTP/2 layer (``gateway.http2``)
under an asyncio protocol.

Why not grpc.aio: under perf_analyzer the gateway's one loop thread saturated on the gRPC
front, calls reached Kafka one at a time and the worker's batches collapsed to 3 to 7 rows
(docs/benchmarks.md, "The gateway's own gRPC server"). grpc.aio costs 258 to 278 µs of CPU
per call on this machine before any work; this server 53 to 72 µs. It serves the same
servicer (``gateway.grpc_front.InferenceServicer``), so the handlers are those grpc.aio runs,
and keeps what Triton's clients use:

- the unary and the bidirectional-streaming methods of one protobuf service, by ``:path``;
  a method the servicer does not override, or an unknown path, is UNIMPLEMENTED;
- a context with ``abort``, ``set_code``/``set_details``, ``invocation_metadata`` and
  ``time_remaining``, as the handlers use grpc.aio's;
- ``grpc-timeout``: past it the handler is cancelled and the call ends DEADLINE_EXCEEDED;
  a malformed one (not 1 to 8 digits and a unit, as the gRPC spec writes it) ends that
  call INTERNAL; a stream the client resets (a cancelled call) or a connection it drops
  cancels its handlers, as grpc.aio does;
- request messages compressed with ``gzip`` or ``deflate`` (``grpc-encoding``, as
  tritonclient's ``compression_algorithm`` sends them) are inflated, up to the size limit;
  another encoding is UNIMPLEMENTED, and every answer names the accepted ones in
  ``grpc-accept-encoding``; answers are sent uncompressed;
- a message over ``max_message_bytes``, before or after inflating, is RESOURCE_EXHAUSTED;
  a second request message on a unary call is INTERNAL (nothing past the first is kept);
- past ``max_buffered_bytes`` of request messages not yet handed to their handlers on one
  connection (messages still arriving, and a streaming call's queued ones), its calls'
  stream windows are held back (HTTP/2 flow control: each may send what is left of its
  window, 1 MiB at most) but for the oldest call with a message half received, so that one
  completes, is handed over and frees its bytes; under the limit again, every call gets its
  window back. Clients see back-pressure, not an error; a call whose request message stops arriving
  for ``stall_s`` (a unary call's, or a streaming call's begun one) ends DEADLINE_EXCEEDED,
  and so does one whose request message is not whole ``max_message_s`` after its first
  bytes came, however steadily they trickle in (each message of a stream timed on its own);
  so one connection cannot hold a message of almost the size limit on each of its streams,
  nor hold any for ever;
- HTTP/2 flow control both ways: answers wait for the client's window; a streaming
  call's complete request messages hold back their bytes of its window until its handler
  reads them (a client that sends faster than its answers are made is held back by
  HTTP/2 itself), while the bytes of a message still arriving are given back as they
  come (a message bigger than the window gets through; the size limit bounds it); a
  client that does not read its answers holds the next ones back (the transport's
  ``pause_writing``) and is itself no longer read until it does, so answers of any kind
  (trailers, resets, acknowledgements) are not queued in memory;
- an unexpected error in handling one stream's frames ends that call INTERNAL; the
  connection and its other calls go on;
- at most ``max_streams`` concurrent streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS);
  a connection whose HTTP/2 preface does not come within ``handshake_s`` is closed;
- TLS (with ALPN ``h2``, which gRPC clients require) from the same files as HTTPS;
- TCP keepalive on every connection (``KEEPALIVE`` by default: probes after 2 h idle, as
  grpc-core's servers ping; ``tcp_keepalive`` sets the timing), so a client gone without
  closing is found and its connection closed;
- PING: answered; with a ``pings`` policy (``ping_policy``: the gateway's
  ``gateway.grpc_http2_*`` and ``grpc_keepalive_permit_without_calls`` settings, Triton's
  flags, as grpc.aio gets them), a client that pings too often is struck out as by
  grpc-core's servers: GOAWAY ENHANCE_YOUR_CALM ``too_many_pings`` and the connection
  closed (``gateway.http2``'s docstring); without one every ping is answered, at any
  rate. This server sends no pings of its own (TCP keepalive instead);
- a stop sends GOAWAY, lets the calls in flight finish (up to a grace period), then closes.

Not served: compressed answers and server reflection; binary (``-bin``) metadata is decoded
from base64 as gRPC does (padded or not; a value that is not base64 ends the call
INVALID_ARGUMENT before its handler runs, where grpc-core says INTERNAL).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import socket
import ssl
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from plaza.errors import ConfigError
from plaza.gateway import http2
from plaza.gateway.http_server import MAX_BODY_S, STALL_S, drain_and_close
from plaza.settings import GatewaySettings

log = logging.getLogger(__name__)

MAX_STREAMS = 1024
"""Concurrent streams (calls) a connection may open (SETTINGS_MAX_CONCURRENT_STREAMS)."""

WINDOW_BYTES = 1 << 20
"""The receive window this server grants each stream and the connection: a request of the
sample models' size arrives without waiting for a WINDOW_UPDATE."""

FLUSH_BYTES = 64 << 10
"""Frames pending past this are written at once rather than at the end of the loop's
iteration, so that a client that does not read holds the next answers back
(``pause_writing``) instead of having them queued in memory."""

BUFFERED_MESSAGES = 4
"""By default a connection may hold this many times ``max_message_bytes`` of request
messages not yet handed to their handlers (``GrpcServer``'s ``max_buffered_bytes``)."""

HANDSHAKE_S = 20.0
"""A connection whose HTTP/2 preface has not come this long after it opened is closed."""

BACKLOG = 2048
"""listen() backlog."""

KEEPALIVE = ((socket.TCP_KEEPIDLE, 7200), (socket.TCP_KEEPINTVL, 20), (socket.TCP_KEEPCNT, 3))
"""TCP keepalive on every connection: probes after 2 h without traffic (grpc-core servers'
default keepalive time), 20 s apart, three unanswered ones close it. gRPC clients keep
their connections for as long as they live, so no idle timeout closes them; a client gone
without a FIN (its host down, a network cut) is found this way instead of held forever."""
TCP_KEEPIDLE_MAX = 32767
"""Linux's largest TCP_KEEPIDLE and TCP_KEEPINTVL, in seconds."""


def tcp_keepalive(time_ms: int, timeout_ms: int) -> tuple[tuple[int, int], ...]:
    """``KEEPALIVE``'s options for gRPC's keepalive time and timeout (Triton's
    --grpc-keepalive-time and --grpc-keepalive-timeout): probes after ``time_ms`` without
    traffic, ``timeout_ms`` apart (whole seconds, at least 1), three unanswered close it."""

    def seconds(ms: int) -> int:
        return min(max(-(-ms // 1000), 1), TCP_KEEPIDLE_MAX)

    return (
        (socket.TCP_KEEPIDLE, seconds(time_ms)),
        (socket.TCP_KEEPINTVL, seconds(timeout_ms)),
        (socket.TCP_KEEPCNT, 3),
    )


def ping_policy(gateway: GatewaySettings) -> http2.PingPolicy:
    """The limits on a client's pings from the gateway's settings (Triton's
    --grpc-http2-min-recv-ping-interval-without-data, --grpc-http2-max-ping-strikes and
    --grpc-keepalive-permit-without-calls), as ``grpc_front.server_options`` gives them to
    grpc.aio."""
    return http2.PingPolicy(
        min_interval_s=gateway.grpc_http2_min_recv_ping_interval_without_data_ms / 1000,
        max_strikes=gateway.grpc_http2_max_ping_strikes,
        permit_without_calls=gateway.grpc_keepalive_permit_without_calls,
    )


_PREFIX = struct.Struct(">BI")  # a gRPC message: compressed flag, length
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
"""zlib's window bits of the request encodings served (gRPC's deflate is zlib's format)."""
_HEADERS = (
    b"\x88"  # :status 200, from HPACK's static table
    + http2.literal(b"content-type", b"application/grpc")
    + http2.literal(b"grpc-accept-encoding", b"identity,deflate,gzip")
)
_OK = http2.literal(b"grpc-status", b"0")
_PRINTABLE = (
    " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"  # grpc-message keeps these, and %-encodes the rest
)
MAX_DETAILS = 4096
"""An error's message is cut to this many characters in ``grpc-message``."""
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class CallEnded(grpc.aio.AbortError):  # type: ignore[misc]
    """A call's status was decided (``Context.abort``): its trailers say which. A
    grpc.aio.AbortError, so that handlers written for grpc.aio let it through."""


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: its request class, whether it streams, and the servicer's handler (None:
    not implemented)."""

    request: type[Message]
    streaming: bool
    handler: Callable[..., Any] | None


def methods_of(service: ServiceDescriptor, servicer: object, base: type) -> dict[bytes, Method]:
    """The ``:path`` -> Method table of ``service`` on ``servicer``; a method that the
    servicer inherits unchanged from ``base`` (grpc's generated servicer) is unimplemented.
    Server-only or client-only streaming methods are served as unimplemented too."""
    table: dict[bytes, Method] = {}
    for m in service.methods:
        own = getattr(type(servicer), m.name, None)
        implemented = own is not None and own is not getattr(base, m.name, None)
        both = m.client_streaming and m.server_streaming
        one_way = m.client_streaming != m.server_streaming
        handler = getattr(servicer, m.name) if implemented and not one_way else None
        request = message_factory.GetMessageClass(m.input_type)
        table[f"/{service.full_name}/{m.name}".encode()] = Method(request, both, handler)
    return table


class Context:
    """What a handler sees of its call (the subset of ``grpc.aio.ServicerContext`` that
    Plaza's servicer uses)."""

    def __init__(self, headers: list[tuple[bytes, bytes]], deadline: float | None) -> None:
        self._headers = headers
        self.deadline = deadline
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        out: list[tuple[str, str | bytes]] = []
        for k, v in self._headers:
            if k.startswith(b":") or k in (b"te", b"content-type", b"grpc-timeout"):
                continue
            key = k.decode("latin-1")
            if key.endswith("-bin"):
                out.append((key, _binary(v)))  # checked when the call began (_bad_binary)
            else:
                out.append((key, v.decode("latin-1")))
        return tuple(out)

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code, self.details = code, details
        raise CallEnded(details)


def _status(code: grpc.StatusCode, details: str) -> bytes:
    """The trailers of a call that ends with ``code``, HPACK-encoded."""
    status = http2.literal(b"grpc-status", str(code.value[0]).encode())
    if details:  # percent-encoded, as the gRPC spec asks of grpc-message
        message = quote(details[:MAX_DETAILS], safe=_PRINTABLE).encode()
        status += http2.literal(b"grpc-message", message)
    return status


def _binary(value: bytes) -> bytes:
    """A ``-bin`` metadata value's bytes: base64, its padding optional (binascii.Error when
    it is not base64)."""
    return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)


def _bad_binary(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why the call's binary metadata cannot be read, or None when it can."""
    for k, v in headers:
        if k.endswith(b"-bin"):
            try:
                _binary(v)
            except binascii.Error:
                name = k.decode("latin-1")[:64]
                return f"metadata {name!r} is not base64, as a -bin key's value must be"
    return None


class _BadTimeout(ValueError):
    """A ``grpc-timeout`` that is not the gRPC spec's: 1 to 8 ASCII digits and a unit."""


def _deadline(headers: list[tuple[bytes, bytes]]) -> float | None:
    for k, v in headers:
        if k == b"grpc-timeout":
            digits, unit = v[:-1], v[-1:]
            if not (0 < len(digits) <= 8 and digits.isdigit() and unit in _TIMEOUT_UNITS):
                raise _BadTimeout(f"malformed grpc-timeout {v.decode('latin-1')[:32]!r}")
            return time.monotonic() + int(digits) * _TIMEOUT_UNITS[unit]
    return None


class _Call:
    """One stream: its request messages as they arrive, and the task that answers it."""

    __slots__ = (
        "begun", "buffer", "context", "counted", "headers_sent", "held", "id", "kept",
        "last_data", "messages", "method", "received", "task", "wbits",
    )  # fmt: skip

    def __init__(
        self, stream_id: int, method: Method, context: Context, wbits: int | None, now: float
    ) -> None:
        self.id = stream_id
        self.method = method
        self.context = context
        self.wbits = wbits  # how its compressed messages inflate (None: no grpc-encoding)
        self.buffer = bytearray()
        # bounded by HTTP/2: a streaming call's queued messages hold back their window
        self.messages: asyncio.Queue[tuple[Message, int] | None] = asyncio.Queue()
        self.held = 0  # bytes of the queued, unread messages: the window to hold back
        self.kept = 0  # bytes received and not given back (at most ``held`` once settled)
        self.received = 0  # request messages so far
        self.counted = 0  # its bytes in the connection's ``unread``: buffer and held
        self.last_data = now  # when its last request bytes came (the loop's clock)
        self.begun: float | None = None  # when the message half received began (its first bytes)
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False

    def stalled(self) -> bool:
        """Whether it waits for a request message that this side does not hold back: a
        unary call's, or a streaming call's begun one with nothing queued for its handler
        (one whose queue is full, or whose window the connection withholds, may be held
        back by it)."""
        if self.held or not self.messages.empty() or self.kept > self.held:
            return False  # this side holds back its message, or its window
        return bool(self.buffer) or not (self.method.streaming or self.received)


class GrpcProtocol(asyncio.Protocol):
    """One HTTP/2 connection (``gateway.http2.Connection``) and the calls on it."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.h2 = http2.Connection(
            self, max_streams=server.max_streams, window=WINDOW_BYTES, pings=server.pings
        )
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = server.loop.create_future()
        self._windows: dict[int, asyncio.Future[None]] = {}  # sends waiting for window
        self._going_away = False
        self._flush_due = False
        self._handshake: asyncio.TimerHandle | None = None
        self.unread = 0  # bytes of request messages not yet handed to their handlers
        self._withholding = False  # calls' windows held back: unread was over the limit
        self._stall_check: asyncio.TimerHandle | None = None
        self._read_since = 0.0  # when reading last went on after a pause (the loop's clock)
        self._writable = asyncio.Event()  # cleared while the transport's buffer is full
        self._writable.set()

    # -- the connection ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        _keep_alive(transport.get_extra_info("socket"), self.server.tcp_keepalive)
        self.h2.preamble()
        self._flush()
        # a client that never sends HTTP/2's preface must not hold a connection for ever
        self._handshake = self.server.loop.call_later(self.server.handshake_s, self._no_preface)

    def _no_preface(self) -> None:
        if not self.h2.started and self.transport is not None:
            log.debug("gRPC connection closed: no HTTP/2 preface in %g s", self.server.handshake_s)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
        if self._stall_check is not None:
            self._stall_check.cancel()
        self.server.connections.discard(self)
        for call in self.calls.values():  # the client went away: its calls are cancelled
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        for waiter in self._windows.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection lost"))
        self._windows.clear()
        self._writable.set()  # (the calls waiting on it are cancelled above)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        """A client that does not read: answers wait, and so does what it sends (every
        frame may make an answer: trailers, a reset, an acknowledgement), so the buffer
        stays bounded."""
        self._writable.clear()
        self.h2.paused = True  # the frames of the bytes already read wait in its buffer
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writable.set()
        self.h2.paused = False
        self._read_since = self.server.loop.time()  # unread meanwhile: no call's stall
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
            # the frames left unread, once the transport's callback is over
            self.server.loop.call_soon(self._read_held)

    def _read_held(self) -> None:
        if not self.h2.paused and self.transport is not None and not self.transport.is_closing():
            self.data_received(b"")

    def _flush(self) -> None:
        out = self.h2.out
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes(out))
        out.clear()

    def _flush_soon(self) -> None:
        """Write what is pending once the loop has run the callbacks already due: answers
        that complete together (a reply stream's read resolves many calls at once) go out
        in one write, not one system call each."""
        if not self._flush_due:
            self._flush_due = True
            self.server.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_due = False
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            self.h2.receive(data)
        except http2.ConnectionError_ as exc:
            log.debug("gRPC connection closed on a protocol error: %s", exc)
            self.h2.goaway(exc.code, str(exc))
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        self._flush()

    def shutdown(self) -> None:
        """GOAWAY: no new calls; the calls in flight go on. Closes once they are done."""
        self._going_away = True
        self.h2.goaway(http2.NO_ERROR)
        self._flush()
        if not self.calls and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- the connection's stream events (gateway.http2.Handler) ---------------------------
    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        try:
            self._request(stream_id, headers, ended)
        except Exception as exc:
            self._stream_failed(stream_id, exc)

    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        if self._going_away:
            self._trailers_only(stream_id, _status(grpc.StatusCode.UNAVAILABLE, "stopping"))
            return
        path = next((v for k, v in headers if k == b":path"), b"")
        method = self.server.methods.get(path)
        if method is None or method.handler is None:
            what = "Method not found!" if method is None else "Method not implemented!"
            self._trailers_only(stream_id, _status(grpc.StatusCode.UNIMPLEMENTED, what))
            return
        encoding = next((v for k, v in headers if k == b"grpc-encoding"), b"identity")
        if encoding != b"identity" and encoding not in _WBITS:
            text = encoding.decode("latin-1")
            why = f"grpc-encoding {text!r} is not served (identity, deflate and gzip are)"
            self._trailers_only(stream_id, _status(grpc.StatusCode.UNIMPLEMENTED, why))
            return
        try:
            deadline = _deadline(headers)
        except _BadTimeout as exc:  # this call's alone: grpc-core ends it with an error too
            self._trailers_only(stream_id, _status(grpc.StatusCode.INTERNAL, str(exc)))
            return
        bad = _bad_binary(headers)
        if bad is not None:
            self._trailers_only(stream_id, _status(grpc.StatusCode.INVALID_ARGUMENT, bad))
            return
        context = Context(headers, deadline)
        loop = self.server.loop
        call = _Call(stream_id, method, context, _WBITS.get(encoding), loop.time())
        self.calls[stream_id] = call
        call.task = loop.create_task(self._serve(call))
        if self._stall_check is None:
            self._stall_check = loop.call_later(self.server.check_s, self._end_stalled)
        if ended:
            call.messages.put_nowait(None)

    def on_data(self, stream_id: int, data: bytes, flow_length: int, ended: bool) -> None:
        try:
            self._data(stream_id, data, flow_length, ended)
        except Exception as exc:
            self._stream_failed(stream_id, exc)

    def _data(self, stream_id: int, data: bytes, flow_length: int, ended: bool) -> None:
        call = self.calls.get(stream_id)
        if call is None:
            return
        call.kept += flow_length
        call.last_data = self.server.loop.time()
        if data:
            self._messages(call, data)
            if stream_id not in self.calls:
                return  # refused
            self._recount(call)
        self._give_back(call)
        if ended:
            call.messages.put_nowait(None)

    def _give_back(self, call: _Call) -> None:
        """Give back the window the call's queued messages do not hold: a message still
        arriving, padding, a unary call's message (bounded by the size limit), or a message
        its handler has read. A message that completes after parts of it went back holds
        back as much of what comes next (so the queue's bytes stay within about twice the
        window, however the client cuts its frames)."""
        spare = call.kept - call.held
        if spare <= 0:
            return
        if self.unread > self.server.max_buffered_bytes and call is not self._favoured():
            self._withholding = True  # its window comes back under the limit (``_recount``)
            return
        call.kept = call.held
        self.h2.give_back(call.id, spare)

    def _favoured(self) -> _Call | None:
        """Over the connection's limit, the call whose window still comes back: the oldest
        with a request message half received (it completes, and frees its bytes)."""
        return next((c for c in self.calls.values() if c.buffer), None)

    def _release(self) -> None:
        """After the connection's unread bytes fell: under the limit, every call withheld
        gets its window back; over it still, the call now favoured does."""
        if not self._withholding:
            return
        if self.unread <= self.server.max_buffered_bytes:
            self._withholding = False
            for call in list(self.calls.values()):
                self._give_back(call)
        elif (favoured := self._favoured()) is not None:
            self._give_back(favoured)
        self._flush_soon()

    def on_end(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.messages.put_nowait(None)

    def _stream_failed(self, stream_id: int, exc: Exception) -> None:
        """An unexpected error handling one stream's frames: that call ends INTERNAL and
        the stream is reset; the connection and its other calls go on."""
        if isinstance(exc, http2.ConnectionError_):
            raise exc  # the connection's own: GOAWAY (``data_received``)
        log.error("gRPC stream %d failed", stream_id, exc_info=exc)
        details = f"Unexpected {type(exc).__name__}: {exc}"
        call = self.calls.get(stream_id)
        if call is not None:
            self._refuse(call, grpc.StatusCode.INTERNAL, details)
        elif stream_id in self.h2.streams:
            self._trailers_only(stream_id, _status(grpc.StatusCode.INTERNAL, details))
            self.h2.reset(stream_id, http2.NO_ERROR)

    def on_reset(self, stream_id: int) -> None:
        call = self._drop(stream_id)
        if call is not None and call.task is not None:
            call.task.cancel()  # a cancelled call: its handler stops waiting
        waiter = self._windows.pop(stream_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("stream reset"))

    def on_window(self, stream_id: int) -> None:
        if stream_id == 0:
            waiters, self._windows = self._windows, {}
        else:
            w = self._windows.pop(stream_id, None)
            waiters = {stream_id: w} if w is not None else {}
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_result(None)

    # -- request messages ---------------------------------------------------------------------
    def _messages(self, call: _Call, data: bytes) -> None:
        """Cut the stream's bytes into gRPC messages (a 5-byte prefix each) and queue them."""
        if call.buffer:
            call.buffer += data
            buf: bytes | bytearray = call.buffer
        else:
            buf = data
        at, end = 0, len(buf)
        limit = self.server.max_message_bytes
        streaming = call.method.streaming
        while end - at >= 5:
            if call.received and not streaming:
                many = "a unary call sent more than one request message"
                self._refuse(call, grpc.StatusCode.INTERNAL, many)
                return
            compressed, length = _PREFIX.unpack_from(buf, at)
            if length > limit:
                too_big = f"request message of {length} bytes is over the limit of {limit}"
                self._refuse(call, grpc.StatusCode.RESOURCE_EXHAUSTED, too_big)
                return
            if end - at - 5 < length:
                break
            raw = buf[at + 5 : at + 5 + length]
            at += 5 + length
            try:
                if compressed:
                    raw = _inflate(raw, call.wbits, limit)
                message = call.method.request.FromString(raw)
            except _TooBig:
                too_big = f"request message inflates past the limit of {limit} bytes"
                self._refuse(call, grpc.StatusCode.RESOURCE_EXHAUSTED, too_big)
                return
            except (zlib.error, DecodeError) as exc:
                self._refuse(call, grpc.StatusCode.INTERNAL, f"could not read the request: {exc}")
                return
            call.received += 1
            if streaming:  # its window comes back as its handler reads it (``_requests``)
                call.held += 5 + length
                call.messages.put_nowait((message, 5 + length))
            else:
                call.messages.put_nowait((message, 0))
        if at < end and (at or buf is not call.buffer):
            call.begun = call.last_data  # a message began in these bytes: its time runs
        elif at == end:
            call.begun = None
        if buf is call.buffer:
            del call.buffer[:at]
        elif at < end:
            call.buffer += buf[at:]

    def _drop(self, stream_id: int) -> _Call | None:
        """The call of ``stream_id`` is over: forget it and the request bytes it held."""
        call = self.calls.pop(stream_id, None)
        if call is not None:
            self.unread -= call.counted
            call.counted = 0
            call.buffer.clear()
            self._release()
        return call

    def _recount(self, call: _Call) -> None:
        """The connection's ``unread``, after the call's request bytes changed."""
        now = len(call.buffer) + call.held
        fell = now < call.counted
        self.unread += now - call.counted
        call.counted = now
        if fell:
            self._release()

    def _end_stalled(self) -> None:
        """End the calls whose request messages stopped coming ``stall_s`` ago, or began
        ``max_message_s`` ago and are not whole (checked every ``check_s`` while the
        connection has calls)."""
        self._stall_check = None
        if not self.calls or self.transport is None:
            return
        loop, now = self.server.loop, self.server.loop.time()
        for call in list(self.calls.values()):
            why = self._late(call, now)
            if why is not None:
                self._refuse(call, grpc.StatusCode.DEADLINE_EXCEEDED, why)
        self._flush()
        self._stall_check = loop.call_later(self.server.check_s, self._end_stalled)

    def _late(self, call: _Call, now: float) -> str | None:
        """Why ``call``'s request message is too late to go on with; None while it is not.
        Only a call that waits on its client is late: while this side holds its message
        or window back, or read nothing (paused: its bytes may have waited on it), its
        message's time starts again."""
        stall_s, max_s = self.server.stall_s, self.server.max_message_s
        if self.h2.paused or not call.stalled():
            if call.begun is not None:
                call.begun = now
            return None
        since = now - stall_s
        if call.last_data <= since and self._read_since <= since:
            return f"no bytes of the request message came for {stall_s:g} s"
        if call.begun is not None and max(call.begun, self._read_since) <= now - max_s:
            return f"the request message was not whole {max_s:g} s after its first bytes"
        return None

    def _refuse(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        """End a call that cannot go on with ``code``: its handler is cancelled, and the
        client is told to stop sending (RST_STREAM NO_ERROR after the status)."""
        self._drop(call.id)
        if call.task is not None:
            call.task.cancel()
        status = _status(code, details)
        self.h2.send_headers(call.id, status if call.headers_sent else _HEADERS + status, True)
        self.h2.reset(call.id, http2.NO_ERROR)
        self._flush_if_full()

    # -- answering -------------------------------------------------------------------------
    async def _serve(self, call: _Call) -> None:
        deadline = call.context.deadline
        timer = None
        if deadline is not None:
            loop = self.server.loop
            left = max(deadline - time.monotonic(), 0.0)
            timer = loop.call_at(loop.time() + left, self._expire, call)
        try:
            handler = call.method.handler
            assert handler is not None
            if call.method.streaming:
                async for response in handler(self._requests(call), call.context):
                    await self._send_message(call, response)
            else:
                got = await call.messages.get()
                if got is None:
                    status = _status(grpc.StatusCode.INTERNAL, "a unary call sent no message")
                    self._finish(call, status)
                    return
                response = await handler(got[0], call.context)
                await self._send_message(call, response)
            self._finish(call, _OK)
        except CallEnded:
            code = call.context.code or grpc.StatusCode.UNKNOWN
            self._finish(call, _status(code, call.context.details))
        except NotImplementedError:
            details = call.context.details or "Method not implemented!"
            self._finish(call, _status(grpc.StatusCode.UNIMPLEMENTED, details))
        except ConnectionError:
            pass  # the stream or the connection went away while an answer waited for window
        except asyncio.CancelledError:
            if call.context.code is not grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            self._finish(call, _status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            self.h2.reset(call.id, http2.CANCEL)
            self._flush()
        except Exception as exc:
            log.exception("gRPC call %s failed", call.method.handler)
            code = call.context.code or grpc.StatusCode.UNKNOWN
            self._finish(call, _status(code, f"Unexpected {type(exc).__name__}: {exc}"))
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, call: _Call) -> None:
        if call.task is not None and not call.task.done():
            call.context.code = grpc.StatusCode.DEADLINE_EXCEEDED
            call.task.cancel()

    async def _requests(self, call: _Call) -> AsyncIterator[Message]:
        while (got := await call.messages.get()) is not None:
            message, size = got
            call.held -= size  # the next messages' window, as this one is read
            if call.id in self.calls:
                self._recount(call)
            self._give_back(call)
            self._flush_soon()
            yield message

    async def _send_message(self, call: _Call, response: Message) -> None:
        if not self._writable.is_set():
            await self._writable.wait()
        msg = response.SerializeToString()
        h2 = self.h2
        if call.id not in self.calls:
            raise ConnectionError("stream reset")
        if not call.headers_sent:
            h2.send_headers(call.id, _HEADERS)
            call.headers_sent = True
        data = memoryview(_PREFIX.pack(0, len(msg)) + msg)
        while data:
            sent = h2.send_data(call.id, data)
            data = data[sent:]
            if not data:
                if len(h2.out) >= FLUSH_BYTES:
                    self._flush()  # big answers go now: the transport can push back
                elif call.method.streaming:  # soon: a unary answer goes with its trailers
                    self._flush_soon()
                break
            if call.id not in self.calls:
                raise ConnectionError("stream reset")
            self._flush()
            waiter = self._windows.get(call.id)
            if waiter is None:
                waiter = self._windows[call.id] = self.server.loop.create_future()
            await waiter

    def _finish(self, call: _Call, status: bytes) -> None:
        if self._drop(call.id) is None:
            return  # reset by the client: nothing more to say
        self.h2.send_headers(call.id, status if call.headers_sent else _HEADERS + status, True)
        if self._going_away and not self.calls and self.transport is not None:
            self._flush()
            self.transport.close()
        else:
            self._flush_soon()

    def _trailers_only(self, stream_id: int, status: bytes) -> None:
        self.h2.send_headers(stream_id, _HEADERS + status, True)
        self._flush_if_full()

    def _flush_if_full(self) -> None:
        """Write now once FLUSH_BYTES are pending: answers made while one read's frames
        are handled (many small calls refused) meet the transport's push-back part way
        (``pause_writing`` stops the frames after), not after the whole read."""
        if len(self.h2.out) >= FLUSH_BYTES:
            self._flush()


class _TooBig(Exception):
    """A compressed message that inflates past the size limit."""


def _inflate(raw: bytes | bytearray, wbits: int | None, limit: int) -> bytes:
    """A compressed message's bytes, inflated by at most ``limit`` bytes (a small message
    that inflates to gigabytes is refused part way, not held in memory)."""
    if wbits is None:
        raise zlib.error("a message is flagged compressed but the call has no grpc-encoding")
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(raw, limit + 1)
    if len(out) > limit:
        raise _TooBig
    if not inflater.eof:
        raise zlib.error("the compressed message is cut short")
    return out


def _keep_alive(sock: socket.socket | None, options: tuple[tuple[int, int], ...]) -> None:
    """Turn TCP keepalive on with ``options``' timing (TCP connections only)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in options:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


class GrpcServer:
    """A listening gRPC server over a method table (``methods_of``); ``start``, then ``stop``."""

    def __init__(
        self,
        methods: dict[bytes, Method],
        *,
        max_message_bytes: int,
        max_buffered_bytes: int | None = None,
        max_streams: int = MAX_STREAMS,
        handshake_s: float = HANDSHAKE_S,
        stall_s: float = STALL_S,
        max_message_s: float = MAX_BODY_S,
        ssl_context: ssl.SSLContext | None = None,
        tcp_keepalive: tuple[tuple[int, int], ...] = KEEPALIVE,
        pings: http2.PingPolicy | None = None,
    ) -> None:
        self.methods = methods
        self.pings = pings
        """The limits on a client's pings (``ping_policy()``; None: every ping answered)."""
        self.tcp_keepalive = tcp_keepalive
        """TCP keepalive's options on every connection (``tcp_keepalive()``)."""
        self.max_message_bytes = max_message_bytes
        self.max_buffered_bytes = max_buffered_bytes or BUFFERED_MESSAGES * max_message_bytes
        """The most request bytes a connection holds unread (None: BUFFERED_MESSAGES
        times ``max_message_bytes``)."""
        self.stall_s = stall_s
        self.max_message_s = max_message_s
        """A request message not whole this long after its first bytes came ends its call
        DEADLINE_EXCEEDED (the HTTP front's ``max_body_s``)."""
        self.check_s = min(stall_s, max_message_s) / 2
        """How often a connection with calls looks for late request messages."""
        self.max_streams = max_streams
        self.handshake_s = handshake_s
        self.ssl_context = ssl_context
        self.connections: set[GrpcProtocol] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on ``host:port``; returns the port. ``reuse_port`` (``SO_REUSEPORT``):
        several gateway processes share it; without it a port that another server holds is
        refused (ConfigError), not silently shared."""
        try:
            self._server = await self.loop.create_server(
                lambda: GrpcProtocol(self),
                host,
                port,
                ssl=self.ssl_context,
                # a TLS handshake not done in time is a preface not come (asyncio's 60 s else)
                ssl_handshake_timeout=None if self.ssl_context is None else self.handshake_s,
                backlog=BACKLOG,
                reuse_port=reuse_port,
            )
        except OSError as exc:
            raise ConfigError(f"the gRPC front cannot listen on {host}:{port}: {exc}") from exc
        sock: socket.socket = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Stop listening; GOAWAY on every connection; calls in flight get ``grace``
        seconds (None: as long as they take)."""
        await drain_and_close(self._server, self.connections, grace)


def alpn_h2(context: ssl.SSLContext | None) -> ssl.SSLContext | None:
    """``context`` set to offer HTTP/2 by ALPN (gRPC clients refuse a TLS server without it)."""
    if context is not None:
        context.set_alpn_protocols(["h2"])
    return context
