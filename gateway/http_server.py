"""The gateway's HTTP/1.1 server: an asyncio protocol over httptools' parser.

Why not uvicorn: under load the gateway spent most of its CPU per request in the HTTP
layers (uvicorn's ASGI scope and messages, Starlette's middleware, routing and Request),
not in Plaza's handler (docs/benchmarks.md, "The gateway's own HTTP server"). This server
keeps what an inference front needs and nothing else:

- one ``Handler`` call per request, with the whole body read (at most ``max_body_bytes``:
  past it the rest is discarded, not kept, and the answer is 413 and a close), the headers
  as a dict of lower-case names;
- keep-alive and pipelining: a connection's requests are answered one at a time, in order;
  once more than ``MAX_PIPELINED`` wait behind the one being answered, reading pauses (the
  read that passed the mark is parsed whole: httptools cannot stop inside one, so a single
  read of many small requests queues them all, each still answered in its turn);
- ``Expect: 100-continue`` (the 100 is sent once no earlier request awaits its answer,
  which it would otherwise precede, unless the body has come meanwhile; never to HTTP/1.0:
  RFC 9110 §10.1.1), chunked
  request bodies (httptools decodes them; their trailers are dropped, never merged into the
  headers: RFC 9110 §6.5.1), HTTP/1.0 (kept alive only when it says ``Connection:
  keep-alive``, and then told so in the answer, else answered ``connection: close`` and
  closed);
- ``Upgrade`` is ignored (RFC 9110 §7.8): the request is answered as any other and the
  connection goes on; CONNECT gets 400 and a close;
- a connection idle for ``keep_alive_s`` is closed (over TLS, so is one whose handshake is
  not done by then); a request whose bytes stop coming for ``stall_s``, or whose request
  line and headers (a chunk's size line, a chunked body's trailers) are not whole
  ``stall_s`` after they began, or whose body is not whole
  ``max_body_s`` after its first bytes came, gets 408 and a close (a client that trickles
  a head or a body a byte at a time must not hold a connection for ever); a request
  line and headers, or a chunked body's trailers, over ``max_head_bytes`` get 431 and a
  close; a malformed request gets 400 and a close, and so does an HTTP/1.1 request without
  a Host header or any request with more than one (RFC 9112 §3.2); a request target over
  ``MAX_URL_BYTES`` gets 414 (one httptools cannot split, 400), and the connection goes on
  (an HTTP/1.0 one kept alive is told so, as after any answer that keeps it);
- a client's FIN reads as the client gone, even when it only half-closes (as Go's net/http
  and uvicorn read it): the connection closes and what it sent is cancelled (the handler
  call in flight; the requests queued behind it are never called), so a caller that
  leaves stops the gateway waiting at once and the service stores a ``cancelled`` answer
  that a worker skips (docs/gateway.md, "Errors"); an answer already being written is
  not cancelled, only a streamed body's rest;
- a stop closes the listening socket, lets the requests in flight finish (up to a grace
  period) and closes idle connections at once.

Responses carry Content-Length, but for a response whose body comes as it is made
(``HttpResponse.stream``: server-sent events of a decoupled model): that one is sent in
chunks (``Transfer-Encoding: chunked``; to an HTTP/1.0 client as it comes, then a close),
each chunk written once the transport has room for it. A client that goes away stops it:
the stream is closed, which cancels what it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Set
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol, cast

import httptools
import orjson

from plaza.errors import ConfigError

log = logging.getLogger(__name__)

MAX_PIPELINED = 16
"""Requests waiting behind the one being answered, per connection, past which reading
pauses (after the read that passed it, parsed whole)."""

BACKLOG = 2048
"""listen() backlog."""

KEEP_ALIVE_S = 5.0
"""An idle keep-alive connection is closed after this long (uvicorn's default)."""

MAX_HEAD_BYTES = 1 << 20
"""The most a request line and its headers, or a chunked body's trailers, may take
(httptools keeps a header whole until it ends). Counted per read, so a head is refused
somewhat past this."""

STALL_S = 30.0
"""A request half received whose next bytes do not come for this long, or whose head has
not come whole this long after it began, is answered 408 and its connection closed (a dead
or hostile client must not hold a connection for ever)."""

MAX_BODY_S = 300.0
"""A request body not whole this long after its first bytes came is answered 408 and its
connection closed, however steadily its bytes trickle in (each gap inside ``STALL_S``);
the default of ``gateway.max_body_s``, where ``math.inf`` (its 0) sets no bound."""


def body_bound_s(setting_s: float) -> float:
    """``gateway.max_body_s`` as the servers take it: 0 (no bound) is ``math.inf``."""
    return setting_s if setting_s > 0 else math.inf


MAX_URL_BYTES = 65535
"""The longest request target httptools can split into path and query: a longer one is
answered 414 ``uri_too_long``."""

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_HOST_REQUIRED = "an HTTP/1.1 request needs one Host header, and no request may have two"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(slots=True)
class HttpRequest:
    """One parsed request: ``path`` without the query, header names lower-case (repeated
    headers joined with ", "), the whole body."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    http_version: str = "1.1"


@dataclass(slots=True)
class HttpResponse:
    """A whole response; ``headers`` are extra to Content-Type and Content-Length."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: AsyncGenerator[bytes, None] | None = None
    """A body sent as it comes, in chunks (``body`` is then not sent); closed when done."""


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def render(
    response: HttpResponse,
    keep_alive: bool,
    head: bool = False,
    chunked: bool = False,
    http_1_0: bool = False,
) -> bytes:
    """The response's bytes on the wire (a HEAD request's without its body); for a streamed
    one only its head, which says ``chunked`` or nothing of its length. An HTTP/1.0 client
    closes unless told ``connection: keep-alive`` (RFC 9112 §9.3), so it is told."""
    reason = _REASONS.get(response.status, b"")
    lines = [b"HTTP/1.1 %d %s\r\n" % (response.status, reason)]
    if response.stream is None:
        lines.append(b"content-length: %d\r\n" % len(response.body))
    elif chunked:
        lines.append(b"transfer-encoding: chunked\r\n")
    if response.content_type is not None:
        lines.append(b"content-type: %s\r\n" % response.content_type.encode("latin-1"))
    for name, value in response.headers:
        lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    elif http_1_0:
        lines.append(b"connection: keep-alive\r\n")
    lines.append(b"\r\n")
    if not head and response.stream is None:
        lines.append(response.body)
    return b"".join(lines)


def _plain(status: int, text: str, code: str = "http_error") -> HttpResponse:
    body = orjson.dumps({"error": text, "code": code})
    return HttpResponse(status, body, "application/json")


class HttpProtocol(asyncio.Protocol):
    """One client connection (httptools calls the ``on_*`` methods while it parses)."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._rejected: HttpResponse | None = None
        # what to answer, in order: a request or the server's own answer, whether the
        # connection is kept after it, and whether it is HTTP/1.0 (told of a keep-alive)
        self._pending: deque[tuple[HttpRequest | HttpResponse, bool, bool]] = deque()
        self._busy = False
        self._paused = False
        self._closing = False
        self._write_ready: asyncio.Future[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._receiving = False
        self._in_body = False  # past the headers: a header now is a trailer
        self._in_head = False  # where a read that ends here counts against max_head_bytes
        self._continue_owed = False  # a 100 Continue to send once the answers ahead are out
        self._head_bytes = 0
        self._replay: bytes | None = None  # an Upgrade request's head, without the Upgrade
        self._last_data = 0.0
        self._head_due: float | None = None  # the head being read must be whole by then
        self._body_due: float | None = None  # the body being read must be whole by then
        self._hosts = 0  # Host headers of the request being read
        self._broken = False
        self._pump: asyncio.Task[None] | None = None
        self._answering: asyncio.Task[None] | None = None  # runs _answer_pending
        self._in_call = False  # _answering awaits the handler: a client gone cancels it
        self.closed: asyncio.Future[None] = self._loop.create_future()

    # -- the transport's callbacks -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._server.connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        self._cancel_idle()
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        if self._pump is not None:
            self._pump.cancel()  # a streamed body's client went away: stop what it waits for
        if self._in_call and self._answering is not None:
            self._answering.cancel()  # its caller went away: the service cancels the request
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        self._last_data = self._loop.time()
        try:
            self._parse(data)
            if self._in_head:  # this read ended inside a head (or trailers)
                self._head_bytes += len(data)
                if self._head_bytes > self._server.max_head_bytes:
                    limit = self._server.max_head_bytes
                    too_long = f"request line and headers (or trailers) over {limit} bytes"
                    self._reject_now(_plain(431, too_long, "headers_too_large"))
        except httptools.HttpParserError as exc:
            self._reject_now(_plain(400, f"malformed HTTP request: {exc}"))

    def _parse(self, data: bytes) -> None:
        """Feed ``data`` to the parser. httptools stops at a request that asks to upgrade,
        its body unread (the body would be the new protocol's); a server may ignore Upgrade
        (RFC 9110 §7.8), so a fresh parser reads its head again without the Upgrade header,
        then the bytes after the stop: its body, and the requests that follow."""
        view = memoryview(data)  # no copy per upgrade when many are pipelined in one read
        while True:
            try:
                self._parser.feed_data(view)
                return
            except httptools.HttpParserUpgrade as exc:
                head, self._replay = self._replay, None
                if head is None:  # refused: CONNECT, or the connection (_reject_now)
                    return
                self._parser = httptools.HttpRequestParser(self)
                self._parser.feed_data(head)
                view = view[exc.args[0] :]

    def pause_writing(self) -> None:
        self._write_ready = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None

    # -- httptools' callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._receiving = True  # the idle timer, if armed, now watches for a stall
        self._in_head = True
        self._head_bytes = 0
        self._head_due = self._last_data + self._server.stall_s
        self._body_due = None
        self._hosts = 0
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0
        self._rejected = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_body:  # a trailer: dropped, as it may not change the request's meaning
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key == "host":
            self._hosts += 1
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._in_head = False
        version = self._parser.get_http_version()
        if self._hosts > 1 or (self._hosts == 0 and version != "1.0"):
            self._reject_now(_plain(400, _HOST_REQUIRED))  # RFC 9112 §3.2
            return
        if self._parser.should_upgrade():
            return  # read again without its Upgrade (_parse), or refused (on_message_complete)
        declared = self._headers.get("content-length", "")
        limit = self._server.max_body_bytes
        expects = (
            self._headers.get("expect", "").lower() == "100-continue"
            and version != "1.0"  # ignored in 1.0 (RFC 9110 §10.1.1)
        )
        # the body's first bytes (a chunked one's first size line: timed as a head) come
        # next, unless the client waits for an answer first
        self._head_due = None if expects else self._last_data + self._server.stall_s
        if declared.isdigit() and int(declared) > limit:
            if expects:  # the client waits before it sends the body: answer it now
                self._reject_now(_payload_too_large(limit))
            else:  # it is sending the body: read it to its end, unkept, then answer
                self._rejected = _payload_too_large(limit)
            return
        if expects and self._transport:
            if self._busy:  # an answer is still to come ahead of it: the 100 goes after it
                self._continue_owed = True
            else:
                self._transport.write(_CONTINUE)

    def on_chunk_header(self) -> None:
        self._in_head = True  # a chunk's size line, or the trailers after the last one

    def on_chunk_complete(self) -> None:
        # the next chunk's size line (or, after the last chunk, the trailers) is timed as a
        # head: its bytes are not body, and a trickle of them must end too
        self._head_due = self._last_data + self._server.stall_s

    def on_body(self, body: bytes) -> None:
        self._continue_owed = False  # the body comes without it
        self._in_head = False
        self._head_due = None
        self._head_bytes = 0  # what was counted was a chunk's size line, not trailers
        if self._body_due is None:  # its first bytes: the whole body must follow in time
            self._body_due = self._last_data + self._server.max_body_s
        if self._rejected is not None or self._broken:
            return
        self._size += len(body)
        if self._size > self._server.max_body_bytes:
            self._rejected = _payload_too_large(self._server.max_body_bytes)
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._receiving = self._in_body = self._in_head = self._continue_owed = False
        self._head_due = self._body_due = None
        self._cancel_idle()  # the request is whole: its answer re-arms the timer
        if self._broken:  # answered already (_reject_now)
            return
        if self._parser.should_upgrade():  # its body, if any, is not read: see _parse
            if self._parser.get_method() == b"CONNECT":
                self._reject_now(_plain(400, "CONNECT is not supported"))
            else:
                self._replay = self._head_without_upgrade()
            return
        keep_alive = bool(self._parser.should_keep_alive()) and not self._closing
        version = self._parser.get_http_version()
        if self._rejected is not None:
            # the body was not read: the connection cannot be trusted for another request
            self._enqueue(self._rejected, False, version == "1.0")
            return
        try:
            url = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:  # the request was framed: answer it
            self._enqueue(_bad_target(len(self._url)), keep_alive, version == "1.0")
            return
        path = url.path.decode("latin-1")
        query = url.query.decode("latin-1") if url.query else ""
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self._parser.get_method().decode("latin-1")
        request = HttpRequest(method, path, query, self._headers, body, version)
        self._enqueue(request, keep_alive, version == "1.0")

    def _head_without_upgrade(self) -> bytes:
        """The request line and headers as parsed, less Upgrade (so httptools reads on)."""
        version = self._parser.get_http_version().encode()
        lines = [b"%s %s HTTP/%s\r\n" % (self._parser.get_method(), self._url, version)]
        for name, value in self._headers.items():
            if name != "upgrade":
                lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
        lines.append(b"\r\n")
        return b"".join(lines)

    # -- answering -----------------------------------------------------------------------
    def _enqueue(self, item: HttpRequest | HttpResponse, keep_alive: bool, http_1_0: bool) -> None:
        self._pending.append((item, keep_alive, http_1_0))
        if len(self._pending) > MAX_PIPELINED and self._transport and not self._paused:
            self._transport.pause_reading()
            self._paused = True
        if not self._busy:
            self._busy = True
            self._answering = self._loop.create_task(self._answer_pending())

    async def _answer_pending(self) -> None:
        try:
            while self._pending and self._transport is not None:
                item, keep_alive, http_1_0 = self._pending.popleft()
                if self._paused and len(self._pending) <= MAX_PIPELINED // 2:
                    self._transport.resume_reading()
                    self._paused = False
                head, chunked = False, not http_1_0  # chunked: an HTTP/1.1 request's answer
                if isinstance(item, HttpRequest):
                    head = item.method == "HEAD"
                    called = await self._call(item)
                    if called is None:  # the client went away: its call was cancelled
                        return
                    response = called
                else:
                    response = item
                keep_alive = (
                    keep_alive and not self._closing and (chunked or response.stream is None)
                )
                if self._transport is None or not await self._writable():
                    await _close_stream(response)
                    return
                self._transport.write(render(response, keep_alive, head, chunked, not chunked))
                if response.stream is not None and not await self._send_stream(
                    response.stream, chunked and not head, head
                ):
                    return
                if not keep_alive:
                    self._transport.close()
                    return
        finally:
            self._busy = False
        if self._closing and self._transport is not None:
            self._transport.close()
            return
        if self._continue_owed and self._transport is not None:
            # the answers ahead of a request that waits for its 100 are out: its turn
            self._continue_owed = False
            self._transport.write(_CONTINUE)
        self._arm_idle()

    async def _writable(self) -> bool:
        """Wait until the transport takes writes again; False when it closed meanwhile."""
        if self._write_ready is not None:
            await self._write_ready
        return self._transport is not None

    async def _send_stream(
        self, stream: AsyncGenerator[bytes, None], chunked: bool, head: bool
    ) -> bool:
        """Send a streamed body (nothing of it for HEAD); False when the connection went
        away, or was closed because the stream failed midway (its status is sent)."""
        if head:
            await _close_stream(stream)
            return True
        pump = self._pump = self._loop.create_task(self._pump_chunks(stream, chunked))
        try:
            await asyncio.wait([pump])
        finally:
            self._pump = None
        if pump.cancelled() or self._transport is None:
            return False
        if pump.exception() is not None:
            log.error("a streamed response failed midway: %r", pump.exception())
            self._transport.close()
            return False
        return True

    async def _pump_chunks(self, stream: AsyncGenerator[bytes, None], chunked: bool) -> None:
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                if not chunk:
                    continue
                if not await self._writable():
                    return
                assert self._transport is not None
                self._transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        if chunked and await self._writable():
            assert self._transport is not None
            self._transport.write(b"0\r\n\r\n")

    async def _call(self, request: HttpRequest) -> HttpResponse | None:
        """The handler's answer; None when the client went away meanwhile: the handler
        was cancelled then (connection_lost), so the service stops waiting and stores a
        ``cancelled`` answer that a worker skips (docs/gateway.md, "Errors")."""
        self._in_call = True
        try:
            return await self._server.handler(request)
        except asyncio.CancelledError:
            task = self._answering
            if self._transport is not None or task is None or not task.cancelling():
                raise  # not the client leaving: a stop of the loop, say
            task.uncancel()
            return None
        except Exception:  # the handler maps every expected error itself
            log.exception("HTTP handler failed on %s %s", request.method, request.path)
            return _plain(500, "internal error")
        finally:
            self._in_call = False

    def _reject_now(self, response: HttpResponse) -> None:
        """Answer a request that cannot be parsed, then close: nothing after it is read."""
        self._broken = True
        if self._transport is not None:
            self._transport.pause_reading()
        if self._transport is not None and not self._busy:
            self._transport.write(render(response, keep_alive=False))
            self._transport.close()
        else:  # answer the requests ahead of it first
            self._pending.append((response, False, False))

    # -- idle and stop -------------------------------------------------------------------
    def _arm_idle(self) -> None:
        if self._transport is not None and self._idle is None:
            self._idle = self._loop.call_later(self._server.keep_alive_s, self._idle_timeout)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_timeout(self) -> None:
        self._idle = None
        if self._transport is None or self._busy or self._pending:
            return
        if not self._receiving:
            self._transport.close()
            return
        now = self._loop.time()
        late = self._late(now)
        if late is not None:
            self._reject_now(_plain(408, late, "request_timeout"))
            return
        # half a request, still coming in: look again at its first deadline
        stalled_at = self._last_data + self._server.stall_s
        due = min(d for d in (stalled_at, self._head_due, self._body_due) if d is not None)
        self._idle = self._loop.call_later(due - now, self._idle_timeout)

    def _late(self, now: float) -> str | None:
        """Why the request half received is too late to go on with; None while it is not."""
        stall_s = self._server.stall_s
        if self._head_due is not None and self._head_due <= now:
            return f"the request's head (or a chunk size line, trailers) took over {stall_s:g} s"
        if self._body_due is not None and self._body_due <= now:
            return f"the request's body took over {self._server.max_body_s:g} s"
        if self._last_data + stall_s <= now:
            return f"no bytes of the request came for {stall_s:g} s"
        return None

    def shutdown(self) -> None:
        """Stop taking requests: close now if idle, else after the response in flight."""
        self._closing = True
        if self._transport is not None and not self._busy:
            self._transport.close()

    def abort(self) -> None:
        """Close at once, whatever is in flight."""
        if self._transport is not None:
            self._transport.abort()


async def _close_stream(response: HttpResponse | AsyncGenerator[bytes, None]) -> None:
    """Close a streamed body that is not sent (a HEAD request, a client gone)."""
    stream = response.stream if isinstance(response, HttpResponse) else response
    if stream is not None:
        await stream.aclose()


def _bad_target(length: int) -> HttpResponse:
    """The answer to a request whose target httptools cannot split (path, query)."""
    if length > MAX_URL_BYTES:
        too_long = f"the request target is over {MAX_URL_BYTES} bytes"
        return _plain(414, too_long, "uri_too_long")
    return _plain(400, "the request target is not a valid URL")


def _payload_too_large(limit: int) -> HttpResponse:
    body = b'{"error":"request body is over the limit of %d bytes","code":"payload_too_large"}'
    return HttpResponse(413, body % limit, "application/json")


class HttpServer:
    """A listening HTTP server over ``handler``; ``start``, then ``stop``."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        keep_alive_s: float = KEEP_ALIVE_S,
        stall_s: float = STALL_S,
        max_body_s: float = MAX_BODY_S,
        max_head_bytes: int = MAX_HEAD_BYTES,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.keep_alive_s = keep_alive_s
        self.stall_s = stall_s
        self.max_body_s = max_body_s
        self.max_head_bytes = max_head_bytes
        self.ssl_context = ssl_context
        self.connections: set[HttpProtocol] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> int:
        """Listen on ``host:port`` (or on the bound socket ``sock``); returns the port."""
        # a TLS handshake not done within the idle time closes the connection, as an idle
        # one: asyncio's own default would hold it 60 s
        tls = self.ssl_context
        handshake_s = None if tls is None else self.keep_alive_s
        try:
            if sock is not None:
                self._server = await self.loop.create_server(
                    lambda: HttpProtocol(self),
                    sock=sock,
                    ssl=tls,
                    ssl_handshake_timeout=handshake_s,
                    backlog=BACKLOG,
                )
            else:
                self._server = await self.loop.create_server(
                    lambda: HttpProtocol(self),
                    host,
                    port,
                    ssl=tls,
                    ssl_handshake_timeout=handshake_s,
                    backlog=BACKLOG,
                )
        except OSError as exc:  # the port taken, the host unknown or not this machine's
            raise ConfigError(f"the HTTP front cannot listen on {host}:{port}: {exc}") from exc
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """Stop listening; requests in flight get ``grace_s`` to be answered, then every
        connection still open is closed."""
        await drain_and_close(self._server, self.connections, grace_s)


class Draining(Protocol):
    """A connection a server stops: ``shutdown`` (finish what is in flight, take nothing
    new), ``closed`` (done once it is), ``abort`` (close it now)."""

    closed: asyncio.Future[None]

    def shutdown(self) -> None: ...

    def abort(self) -> None: ...


async def drain_and_close(
    server: asyncio.Server | None, connections: Set[Draining], grace_s: float | None
) -> None:
    """Stop listening, shut every connection down, give them ``grace_s`` (None: as long
    as they take) to finish, then close the ones still open."""
    if server is not None:
        server.close()
    for conn in list(connections):
        conn.shutdown()
    waiting = [c.closed for c in connections]
    if waiting:
        await asyncio.wait(waiting, timeout=grace_s)
    for conn in list(connections):
        conn.abort()
    if server is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)


async def serve_canned(host: str, port: int, answer: bytes) -> None:
    """Answer every request with ``answer`` (JSON) for ever: the front's own cost, for
    ``scripts/http_front_cost.py``."""
    response = HttpResponse(200, answer, "application/json")

    async def canned(request: HttpRequest) -> HttpResponse:
        return response

    server = HttpServer(canned, max_body_bytes=64 << 20)
    await server.start(host, port)
    await asyncio.Event().wait()
