"""The gateway's gRPC server: HTTP/2 by h2's state machine under an asyncio protocol.

Why not grpc.aio: under perf_analyzer the gateway's one loop thread saturated on the gRPC
front, calls reached Kafka one at a time and the worker's batches collapsed to 3 to 7 rows
(docs/benchmarks.md, "The gateway's own gRPC server"). grpc.aio costs 240 to 250 µs of CPU
per call on this machine before any work; this server 140 to 160 µs. It serves the same
servicer (``gateway.grpc_front.InferenceServicer``), so the handlers are those grpc.aio runs,
and keeps what Triton's clients use:

- the unary and the bidirectional-streaming methods of one protobuf service, by ``:path``;
  a method the servicer does not override, or an unknown path, is UNIMPLEMENTED;
- a context with ``abort``, ``set_code``/``set_details``, ``invocation_metadata`` and
  ``time_remaining``, as the handlers use grpc.aio's;
- ``grpc-timeout``: past it the handler is cancelled and the call ends DEADLINE_EXCEEDED;
  a stream the client resets (a cancelled call) or a connection it drops cancels its
  handlers, as grpc.aio does;
- a message over ``max_message_bytes`` is RESOURCE_EXHAUSTED; a compressed one
  UNIMPLEMENTED (no client of Triton's compresses unless told to);
- HTTP/2 flow control both ways: answers wait for the client's window, and a stream's
  request messages are granted window only as its handler reads them (a streaming client
  that sends faster than its answers are made is held back by HTTP/2 itself);
- at most ``max_streams`` concurrent streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS);
- TLS (with ALPN ``h2``, which gRPC clients require) from the same files as HTTPS;
- a stop sends GOAWAY, lets the calls in flight finish (up to a grace period), then closes.

Not served: gRPC's compression, server reflection and health service; binary (``-bin``)
metadata is decoded from base64 as gRPC does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from hyperframe.frame import GoAwayFrame

from plaza.errors import ConfigError
from plaza.gateway.http_server import drain_and_close

log = logging.getLogger(__name__)

MAX_STREAMS = 1024
"""Concurrent streams (calls) a connection may open (SETTINGS_MAX_CONCURRENT_STREAMS)."""

WINDOW_BYTES = 1 << 20
"""The receive window this server grants each stream and the connection: a request of the
sample models' size arrives without waiting for a WINDOW_UPDATE."""

BACKLOG = 2048
"""listen() backlog."""

_PREFIX = struct.Struct(">BI")  # a gRPC message: compressed flag, length
_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_OK = [(b"grpc-status", b"0")]
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
        request = m.input_type._concrete_class
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
                out.append((key, base64.b64decode(v + b"=" * (-len(v) % 4))))
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


def _status(code: grpc.StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    status = [(b"grpc-status", str(code.value[0]).encode())]
    if details:  # percent-encoded, as the gRPC spec asks of grpc-message
        status.append(
            (b"grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
        )
    return status


def _deadline(headers: list[tuple[bytes, bytes]]) -> float | None:
    for k, v in headers:
        if k == b"grpc-timeout" and len(v) >= 2 and v[-1:] in _TIMEOUT_UNITS and v[:-1].isdigit():
            return time.monotonic() + int(v[:-1]) * _TIMEOUT_UNITS[v[-1:]]
    return None


class _Call:
    """One stream: its request messages as they arrive, and the task that answers it."""

    __slots__ = ("buffer", "context", "ended", "headers_sent", "id", "messages", "method", "task")

    def __init__(self, stream_id: int, method: Method, context: Context) -> None:
        self.id = stream_id
        self.method = method
        self.context = context
        self.buffer = bytearray()
        self.messages: asyncio.Queue[tuple[Message, int] | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.ended = False  # the client half-closed (END_STREAM)
        self.headers_sent = False


class GrpcProtocol(asyncio.Protocol):
    """One HTTP/2 connection."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = server.loop.create_future()
        self._windows: dict[int, asyncio.Future[None]] = {}  # sends waiting for window
        self._going_away = False

    # -- the connection ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        conn = self.conn
        conn.initiate_connection()
        conn.update_settings(
            {
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.server.max_streams,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
            }
        )
        conn.increment_flow_control_window(WINDOW_BYTES)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for call in self.calls.values():  # the client went away: its calls are cancelled
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        for waiter in self._windows.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("gRPC connection closed on a protocol error: %s", exc)
            self._flush()  # h2 has queued the GOAWAY
            if self.transport is not None:
                self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self._request(ev.stream_id, ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                self._data(ev.stream_id, ev.data, ev.flow_controlled_length)
            elif isinstance(ev, h2.events.StreamEnded):
                self._half_closed(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self._reset(ev.stream_id)
            elif isinstance(ev, h2.events.WindowUpdated):
                self._window_opened(ev.stream_id)
            elif isinstance(ev, h2.events.RemoteSettingsChanged):
                self._window_opened(0)  # INITIAL_WINDOW_SIZE may have grown every window
            elif isinstance(ev, h2.events.ConnectionTerminated):
                if self.transport is not None:
                    self.transport.close()
                return
        self._flush()

    def shutdown(self) -> None:
        """GOAWAY: no new calls; the calls in flight go on. Closes once they are done.

        The frame is written past h2, whose own ``close_connection`` would close the
        connection's state machine at once and with it the calls in flight."""
        self._going_away = True
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = self.conn.highest_inbound_stream_id
        self._flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(goaway.serialize())
        if not self.calls and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- streams ---------------------------------------------------------------------------
    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        path = next((v for k, v in headers if k == b":path"), b"")
        if self._going_away:
            status = _status(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
            self._trailers_only(stream_id, status)
            return
        method = self.server.methods.get(path)
        if method is None or method.handler is None:
            what = "Method not found!" if method is None else "Method not implemented!"
            self._trailers_only(stream_id, _status(grpc.StatusCode.UNIMPLEMENTED, what))
            return
        call = _Call(stream_id, method, Context(headers, _deadline(headers)))
        self.calls[stream_id] = call
        call.task = self.server.loop.create_task(self._serve(call))

    def _data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        conn = self.conn
        call = self.calls.get(stream_id)
        if call is None:  # answered early (an error) or reset: the data is not wanted
            conn.acknowledge_received_data(flow_length, stream_id)
            return
        # A unary call's window is given back at once (its one message is bounded by the
        # size limit); a stream's as its handler reads each message (``_requests``).
        streaming = call.method.streaming
        conn.acknowledge_received_data(
            flow_length - len(data) if streaming else flow_length, stream_id
        )
        call.buffer += data
        limit = self.server.max_message_bytes
        while len(call.buffer) >= 5:
            compressed, length = _PREFIX.unpack_from(call.buffer)
            if length > limit:
                too_big = f"request message of {length} bytes is over the limit of {limit}"
                self._refuse(call, grpc.StatusCode.RESOURCE_EXHAUSTED, too_big)
                return
            if len(call.buffer) < 5 + length:
                break
            raw = bytes(call.buffer[5 : 5 + length])
            del call.buffer[: 5 + length]
            if compressed:
                self._refuse(
                    call, grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not served"
                )
                return
            try:
                message = call.method.request.FromString(raw)
            except DecodeError as exc:
                self._refuse(call, grpc.StatusCode.INTERNAL, f"could not parse the request: {exc}")
                return
            call.messages.put_nowait((message, 5 + length if streaming else 0))

    def _grant(self, call: _Call, n: int) -> None:
        """Give back ``n`` bytes of a stream's window (a message its handler has read)."""
        if n > 0 and call.id in self.calls:
            self.conn.acknowledge_received_data(n, call.id)
            self._flush()

    def _half_closed(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is not None:
            call.ended = True
            call.messages.put_nowait(None)

    def _reset(self, stream_id: int) -> None:
        call = self.calls.pop(stream_id, None)
        if call is not None and call.task is not None:
            call.task.cancel()  # a cancelled call: its handler stops waiting
        waiter = self._windows.pop(stream_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("stream reset"))

    def _refuse(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        """End a call that cannot go on with ``code``: its handler is cancelled."""
        self.calls.pop(call.id, None)
        if call.task is not None:
            call.task.cancel()
        if call.headers_sent:
            self._end(call.id, _status(code, details))
        else:
            self._trailers_only(call.id, _status(code, details))
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.reset_stream(call.id, h2.errors.ErrorCodes.NO_ERROR)
        self._flush()

    def _window_opened(self, stream_id: int) -> None:
        if stream_id == 0:
            waiters, self._windows = self._windows, {}
        else:
            w = self._windows.pop(stream_id, None)
            waiters = {stream_id: w} if w is not None else {}
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_result(None)

    # -- answering -------------------------------------------------------------------------
    async def _serve(self, call: _Call) -> None:
        deadline = call.context.deadline
        timer = None
        if deadline is not None:
            timer = self.server.loop.call_at(
                self.server.loop.time() + max(deadline - time.monotonic(), 0.0),
                self._expire,
                call,
            )
        try:
            handler = call.method.handler
            assert handler is not None
            if call.method.streaming:
                async for response in handler(self._requests(call), call.context):
                    await self._send_message(call, response)
            else:
                request = await self._one_request(call)
                if request is None:
                    return
                response = await handler(request, call.context)
                await self._send_message(call, response)
            self._finish(call, _OK)
        except CallEnded:
            self._finish(
                call, _status(call.context.code or grpc.StatusCode.UNKNOWN, call.context.details)
            )
        except NotImplementedError:
            self._finish(
                call,
                _status(
                    grpc.StatusCode.UNIMPLEMENTED, call.context.details or "Method not implemented!"
                ),
            )
        except ConnectionError:
            pass  # the stream or the connection went away while an answer waited for window
        except asyncio.CancelledError:
            if call.context.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                self._finish(call, _status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            else:
                raise
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

    async def _one_request(self, call: _Call) -> Message | None:
        got = await call.messages.get()
        if got is None:
            self._finish(
                call, _status(grpc.StatusCode.INTERNAL, "a unary call sent no request message")
            )
            return None
        return got[0]

    async def _requests(self, call: _Call) -> AsyncIterator[Message]:
        while (got := await call.messages.get()) is not None:
            message, size = got
            self._grant(call, size)  # window for the next one only as this one is read
            yield message

    async def _send_message(self, call: _Call, response: Message) -> None:
        msg = response.SerializeToString()
        data = _PREFIX.pack(0, len(msg)) + msg
        conn = self.conn
        if not call.headers_sent:
            if call.id not in self.calls:
                raise ConnectionError("stream reset")
            conn.send_headers(call.id, _HEADERS)
            call.headers_sent = True
        view = memoryview(data)
        while view:
            if call.id not in self.calls:
                raise ConnectionError("stream reset")
            window = min(conn.local_flow_control_window(call.id), conn.max_outbound_frame_size)
            if window <= 0:
                self._flush()
                waiter = self._windows.get(call.id)
                if waiter is None:
                    waiter = self._windows[call.id] = self.server.loop.create_future()
                await waiter
                continue
            conn.send_data(call.id, view[:window].tobytes())
            view = view[window:]
        self._flush()

    def _finish(self, call: _Call, status: list[tuple[bytes, bytes]]) -> None:
        if self.calls.pop(call.id, None) is None:
            return  # reset by the client: nothing more to say
        if call.headers_sent:
            self._end(call.id, status)
        else:
            self._trailers_only(call.id, status)
        self._flush()
        if self._going_away and not self.calls and self.transport is not None:
            self.transport.close()

    def _end(self, stream_id: int, status: list[tuple[bytes, bytes]]) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.send_headers(stream_id, status, end_stream=True)

    def _trailers_only(self, stream_id: int, status: list[tuple[bytes, bytes]]) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.send_headers(stream_id, _HEADERS + status, end_stream=True)
        self._flush()


class GrpcServer:
    """A listening gRPC server over a method table (``methods_of``); ``start``, then ``stop``."""

    def __init__(
        self,
        methods: dict[bytes, Method],
        *,
        max_message_bytes: int,
        max_streams: int = MAX_STREAMS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.methods = methods
        self.max_message_bytes = max_message_bytes
        self.max_streams = max_streams
        self.ssl_context = ssl_context
        self.connections: set[GrpcProtocol] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (``SO_REUSEPORT``, as grpcio binds: several gateway
        processes share it); returns the port."""
        try:
            self._server = await self.loop.create_server(
                lambda: GrpcProtocol(self),
                host,
                port,
                ssl=self.ssl_context,
                backlog=BACKLOG,
                reuse_port=True,
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
