"""The gateway's own gRPC server (``gateway/grpc_server.py``) holds a client's pings to the
gateway's ping settings (Triton's --grpc-http2-* flags) as grpc-core's servers do: a raw
HTTP/2 client over a real socket, pinging back to back, is sent GOAWAY ENHANCE_YOUR_CALM
too_many_pings past the strikes allowed, unless the server's answers clear its strikes.
The servicer is a small one of this file's: no Kafka or Redis is needed."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import hpack
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.gateway import http2
from plaza.gateway.grpc_front import SERVICE
from plaza.gateway.grpc_server import GrpcServer, methods_of, ping_policy
from plaza.settings import GatewaySettings

Frame = tuple[int, int, int, bytes]


class Live(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)


class Client:
    """A raw HTTP/2 client: frames written by hand, frames read one by one."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.next_stream = 1

    async def read(self) -> Frame | None:
        """The next frame, or None at the end of the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(9), 10)
            length = int.from_bytes(head[:3], "big")
            payload = await asyncio.wait_for(self.reader.readexactly(length), 10)
        except asyncio.IncompleteReadError:
            return None
        return head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, payload

    async def until(self, kind: int, flags: int, stream_id: int) -> Frame | None:
        """Frames up to the first of ``kind`` with ``flags`` on ``stream_id`` (None: the
        connection ended first)."""
        while (got := await self.read()) is not None:
            if got[0] == kind and got[1] & flags == flags and got[2] == stream_id:
                return got
            if got[0] == http2.GOAWAY:
                return got
        return None

    async def ping(self) -> Frame | None:
        """A PING; its ACK, or what ended the connection instead (GOAWAY or None)."""
        self.writer.write(http2.frame(http2.PING, 0, 0, b"pingpong"))
        return await self.until(http2.PING, http2.ACK, 0)

    async def server_live(self) -> Frame | None:
        """A ServerLive call; its trailers (or a GOAWAY, or None)."""
        stream_id, self.next_stream = self.next_stream, self.next_stream + 2
        headers = [
            (":method", "POST"), (":scheme", "http"), (":authority", "x"),
            (":path", "/inference.GRPCInferenceService/ServerLive"),
            ("content-type", "application/grpc"), ("te", "trailers"),
        ]  # fmt: skip
        block = self.encoder.encode(headers)
        self.writer.write(
            http2.frame(http2.HEADERS, http2.END_HEADERS, stream_id, block)
            + http2.frame(http2.DATA, http2.END_STREAM, stream_id, b"\0\0\0\0\0")
        )
        return await self.until(http2.HEADERS, http2.END_STREAM, stream_id)


@asynccontextmanager
async def connected(gateway: GatewaySettings) -> AsyncIterator[Client]:
    """Plaza's gRPC server with the ping policy of ``gateway``'s settings, and a client
    past the preface and SETTINGS."""
    table = methods_of(SERVICE, Live(), pb_grpc.GRPCInferenceServiceServicer)
    server = GrpcServer(table, max_message_bytes=1 << 20, pings=ping_policy(gateway))
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = Client(reader, writer)
        writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
        assert await client.until(http2.SETTINGS, http2.ACK, 0) is not None
        try:
            yield client
        finally:
            writer.close()
    finally:
        await server.stop(1.0)


def too_many_pings(got: Frame | None) -> bool:
    if got is None or got[0] != http2.GOAWAY:
        return False
    code = struct.unpack(">I", got[3][4:8])[0]
    return code == http2.ENHANCE_YOUR_CALM and got[3][8:] == b"too_many_pings"


async def test_tritons_default_ping_settings_strike_out_a_client_pinging_without_calls() -> None:
    """Triton's defaults (2 strikes, no pings without calls): the first ping and two
    strikes are answered, the third strike ends the connection."""
    async with connected(GatewaySettings()) as client:
        answers = [await client.ping() for _ in range(3)]
        ended = await client.ping()
        closed = await client.read()
    assert [a is not None and a[0] == http2.PING for a in answers] == [True] * 3
    assert too_many_pings(ended)
    assert closed is None  # the server closed the connection after its GOAWAY


async def test_answers_sent_clear_a_clients_strikes() -> None:
    """One strike allowed: a call answered between pings starts the count over, so the
    connection lives on where two more strikes in a row would have ended it."""
    async with connected(GatewaySettings(grpc_http2_max_ping_strikes=1)) as client:
        before = [await client.ping(), await client.ping()]  # the second: one strike
        first = await client.server_live()
        after = [await client.ping(), await client.ping()]  # again no strike, then one
        second = await client.server_live()
        last = [await client.ping(), await client.ping()]
        ended = await client.ping()  # a second strike in a row: past the limit
    for got in (*before, *after, *last):
        assert got is not None and got[0] == http2.PING
    for trailers in (first, second):
        assert trailers is not None and trailers[0] == http2.HEADERS
    assert too_many_pings(ended)
