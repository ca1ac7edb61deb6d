"""The gateway's own gRPC server (``gateway/grpc_server.py``) at its limits: request messages
past a stream's window, a unary call sent more than one message, a client that never
reads, and one stream's bad headers or failing request beside a call in flight. Calls by
grpc's own client where it can make them, by hand-written frames where it cannot."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import hpack
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.gateway import http2
from plaza.gateway.grpc_front import SERVICE
from plaza.gateway.grpc_server import WINDOW_BYTES, GrpcServer, Method, methods_of
from tests.integration.test_grpc_server import KINDS, LIMIT, Echo, serving, stub
from tests.support import wait_for

INTERNAL = str(grpc.StatusCode.INTERNAL.value[0])


def _request(path: str, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    return [
        (":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", path),
        ("content-type", "application/grpc"), ("te", "trailers"), *extra,
    ]  # fmt: skip


INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def _message(request_id: str, data: bytes = b"") -> bytes:
    """One ModelInferRequest as a gRPC message (its 5-byte prefix and its bytes)."""
    body = pb.ModelInferRequest(id=request_id, raw_input_contents=[data]).SerializeToString()
    return b"\0" + len(body).to_bytes(4, "big") + body


class _Wire:
    """A hand-written HTTP/2 client's side of one connection: frames out, and what the
    server sent back by stream (headers, RST_STREAM codes, WINDOW_UPDATE increments)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.headers: dict[int, dict[str, str]] = {}
        self.ended: set[int] = set()
        self.resets: dict[int, int] = {}
        self.windows: dict[int, int] = {}
        self._received = b""
        writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))

    def call(self, stream_id: int, path: str, *extra: tuple[str, str], ended: bool = False) -> None:
        flags = http2.END_HEADERS | (http2.END_STREAM if ended else 0)
        block = self.encoder.encode(_request(path, extra))
        self.writer.write(http2.frame(http2.HEADERS, flags, stream_id, block))

    def data(self, stream_id: int, data: bytes, ended: bool = False) -> None:
        flags = http2.END_STREAM if ended else 0
        self.writer.write(http2.frame(http2.DATA, flags, stream_id, data))

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Read the server's frames until ``done()``."""
        async with asyncio.timeout(20):
            while not done():
                chunk = await self.reader.read(1 << 16)
                assert chunk, f"the server closed the connection before {what}"
                self._received += chunk
                self._frames()

    def _frames(self) -> None:
        while len(self._received) >= 9:
            length = int.from_bytes(self._received[:3], "big")
            if len(self._received) < 9 + length:
                return
            kind, flags = self._received[3], self._received[4]
            sid = int.from_bytes(self._received[5:9], "big")
            payload = self._received[9 : 9 + length]
            self._received = self._received[9 + length :]
            if kind == http2.HEADERS:
                self.headers.setdefault(sid, {}).update(self.decoder.decode(payload))
                if flags & http2.END_STREAM:
                    self.ended.add(sid)
            elif kind == http2.RST_STREAM:
                self.resets[sid] = int.from_bytes(payload, "big")
            elif kind == http2.WINDOW_UPDATE:
                self.windows[sid] = self.windows.get(sid, 0) + int.from_bytes(payload, "big")


@asynccontextmanager
async def _wire(address: str) -> AsyncIterator[_Wire]:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield _Wire(reader, writer)
    finally:
        writer.close()


# -- 1. request messages past a stream's window ---------------------------------------------


@KINDS
async def test_a_stream_carries_request_messages_bigger_than_its_window(kind: str) -> None:
    """One 2 MiB message, and 300 KB then 900 KB back to back: neither fits the 1 MiB
    window that the stream was granted, and each is answered."""
    async with serving(kind, Echo()) as (_, address), stub(address) as client:

        async def streamed(sizes: list[int]) -> list[int]:
            requests = [
                pb.ModelInferRequest(id=f"s{i}", raw_input_contents=[b"y" * size])
                for i, size in enumerate(sizes)
            ]
            return [
                len(r.infer_response.raw_output_contents[0])
                async for r in client.ModelStreamInfer(iter(requests))
            ]

        async with asyncio.timeout(60):  # a stream that stalls fails here, not at pytest's
            one = await streamed([2 << 20])
            two = await streamed([300_000, 900_000])
    assert one == [2 << 20]
    assert two == [300_000, 900_000]


async def test_a_streams_unread_messages_hold_its_window_however_the_frames_are_cut() -> None:
    """A client that ignores the window, on a stream whose handler reads no more: a
    message still arriving gets its window back (more than the whole window comes back),
    but once one is complete and unread, what follows is held back, even though each
    message ends in a frame of its own one byte: the stream is reset FLOW_CONTROL_ERROR
    rather than messages queued without end."""
    servicer = Echo()
    big = _message("big", b"b" * (3 << 19))  # 1.5 MiB: past the window
    async with serving("plaza", servicer) as (_, address), _wire(address) as wire:
        wire.call(1, STREAM)
        wire.data(1, _message("sleep"))  # its handler waits, reading nothing more
        await asyncio.wait_for(servicer.started.wait(), 10)
        for _ in range(4):
            for at in range(0, len(big) - 1, 1 << 14):
                wire.data(1, big[at : min(at + (1 << 14), len(big) - 1)])
            wire.data(1, big[-1:])
        await wire.until(lambda: 1 in wire.resets, "the stream's reset")
        await asyncio.wait_for(servicer.cancelled.wait(), 10)
    assert wire.resets[1] == http2.FLOW_CONTROL_ERROR
    assert wire.windows.get(1, 0) > WINDOW_BYTES


# -- 2. a unary call sent more than one message ----------------------------------------------


async def test_a_unary_call_sent_a_second_message_ends_internal() -> None:
    servicer = Echo()
    async with serving("plaza", servicer) as (_, address), _wire(address) as wire:
        wire.call(1, INFER)
        wire.data(1, _message("sleep"))
        await asyncio.wait_for(servicer.started.wait(), 10)
        wire.data(1, _message("again", b"z" * 1000))
        await wire.until(lambda: 1 in wire.ended, "the call's end")
        await asyncio.wait_for(servicer.cancelled.wait(), 10)
    assert wire.headers[1]["grpc-status"] == INTERNAL
    assert "more than one request message" in wire.headers[1]["grpc-message"]


# -- 3. a client that never reads ---------------------------------------------------------


async def test_a_client_that_never_reads_is_no_longer_read_and_nothing_piles_up() -> None:
    """Many small calls that end at once in errors (an unknown method: trailers only),
    from a client that reads none of them: once the socket and the transport's buffer are
    full the server stops reading it, so its answers are not queued in memory."""
    calls = 200_000
    encoder = hpack.Encoder()
    flags = http2.END_HEADERS | http2.END_STREAM
    first = encoder.encode(_request("/nope.Service/Method"))
    again = encoder.encode(_request("/nope.Service/Method"))  # all in the table now
    wire = bytearray(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
    wire += http2.frame(http2.HEADERS, flags, 1, first)
    for sid in range(3, 2 * calls, 2):
        wire += http2.frame(http2.HEADERS, flags, sid, again)
    loop = asyncio.get_running_loop()
    async with serving("plaza", Echo()) as (server, address):
        host, port = address.split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before the handshake
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
        sending = asyncio.ensure_future(loop.sock_sendall(sock, bytes(wire)))
        try:
            await wait_for(lambda: len(server.connections) == 1, 10, "the connection")
            (conn,) = server.connections
            paused = "the server to stop reading"
            await wait_for(lambda: not conn.transport.is_reading(), 30, paused)
            buffered = conn.transport.get_write_buffer_size() + len(conn.h2.out)
            read = conn.h2.last_stream_id
        finally:
            sending.cancel()
            sock.close()
    assert read < 2 * calls - 1  # it stopped part way
    assert buffered < 1 << 20  # the transport's limit, and a flush's worth past it


# -- 4. one stream's bad headers or failing request, beside a call in flight --------------


class _Exploding:
    """A request class whose parsing fails in a way the server does not expect."""

    @classmethod
    def FromString(cls, raw: bytes) -> Any:
        raise RuntimeError("boom while parsing")


@pytest.mark.parametrize("trouble", ["overlong grpc-timeout", "unexpected error"])
async def test_one_streams_trouble_ends_that_call_alone(trouble: str) -> None:
    """A grpc-timeout of 400 digits (past the gRPC spec's 8, and past a float), or an
    exception the server does not expect while it reads a request: that call ends
    INTERNAL; the call in flight on the same connection is answered."""
    servicer = Echo()
    table = methods_of(SERVICE, servicer, pb_grpc.GRPCInferenceServiceServicer)
    table[b"/test.Exploding/Call"] = Method(_Exploding, False, servicer.ModelInfer)  # type: ignore[arg-type]
    server = GrpcServer(table, max_message_bytes=LIMIT)
    port = await server.start("127.0.0.1", 0)
    try:
        async with _wire(f"127.0.0.1:{port}") as wire:
            wire.call(1, INFER)
            wire.data(1, _message("held"), ended=True)
            await asyncio.wait_for(servicer.started.wait(), 10)
            if trouble == "overlong grpc-timeout":
                wire.call(3, INFER, ("grpc-timeout", "9" * 400 + "S"))
            else:
                wire.call(3, "/test.Exploding/Call")
            wire.data(3, _message("x"), ended=True)
            await wire.until(lambda: 3 in wire.ended, "the troubled call's end")
            servicer.release.set()
            await wire.until(lambda: 1 in wire.ended, "the call in flight's end")
    finally:
        await server.stop(1.0)
    assert wire.headers[3]["grpc-status"] == INTERNAL
    assert wire.headers[1]["grpc-status"] == "0"
