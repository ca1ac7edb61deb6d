"""The gateway's own gRPC server (``gateway/grpc_server.py``) against grpc's own client,
side by side with grpc.aio serving the same servicer: what a call ends with must not
depend on which server answers it. The servicer here is a small one of this file's (an
echo), so these tests need no Kafka or Redis; the gateway's servicer over this server is
tested end to end in test_gateway_grpc.py.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import hpack
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.gateway import http2
from plaza.gateway.grpc_front import SERVICE
from plaza.gateway.grpc_server import GrpcServer, methods_of
from tests.support import wait_for

LIMIT = 4 << 20
BIG = b"x" * (256 << 10)


class Echo(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """ModelInfer answers its raw inputs as outputs; the request id picks a behaviour."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.answered = 0
        self.release = asyncio.Event()  # what a "held" call waits for (set by a test)
        self.never = asyncio.Event()  # what a "sleep" call waits for: it ends only cancelled

    async def ServerLive(self, request: Any, context: Any) -> Any:
        metadata = dict(context.invocation_metadata())
        return pb.ServerLiveResponse(
            live=metadata.get("x-key") == "v" and metadata.get("x-raw-bin") == b"\x00\xff"
        )

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        if request.id == "sleep":
            self.started.set()
            try:
                await self.never.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if request.id == "held":
            self.started.set()
            await self.release.wait()
        if request.id == "abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "100% wrong: é\nsecond line")
        if request.id == "boom":
            raise RuntimeError("boom")
        return pb.ModelInferResponse(id=request.id, raw_output_contents=request.raw_input_contents)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> Any:
        try:
            async for request in requests:
                if request.id == "sleep":
                    self.started.set()
                    await self.never.wait()
                out = [BIG] if request.id == "big" else request.raw_input_contents
                yield pb.ModelStreamInferResponse(
                    infer_response=pb.ModelInferResponse(id=request.id, raw_output_contents=out)
                )
                self.answered += 1
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@asynccontextmanager
async def serving(kind: str, servicer: Echo) -> AsyncIterator[tuple[Any, str]]:
    """``servicer`` on the gateway's server (plaza) or on grpc.aio; yields (server, address)."""
    if kind == "plaza":
        server: Any = GrpcServer(
            methods_of(SERVICE, servicer, pb_grpc.GRPCInferenceServiceServicer),
            max_message_bytes=LIMIT,
        )
        port = await server.start("127.0.0.1", 0)
    else:
        options = [("grpc.max_receive_message_length", LIMIT)]
        server = grpc.aio.server(options=options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        await server.stop(1.0)


@asynccontextmanager
async def stub(address: str, **kwargs: Any) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=options, **kwargs) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


KINDS = pytest.mark.parametrize("kind", ["plaza", "grpcio"])


@KINDS
async def test_unary_and_streaming_calls_carry_messages_past_the_flow_control_windows(
    kind: str,
) -> None:
    big = bytes(range(256)) * (3 << 12)  # 3 MiB: past HTTP/2's windows both ways
    async with serving(kind, Echo()) as (_, address), stub(address) as client:
        answer = await client.ModelInfer(pb.ModelInferRequest(id="a", raw_input_contents=[big]))
        parts = [big[: i * 997] for i in range(300)]
        requests = [
            pb.ModelInferRequest(id=f"s{i}", raw_input_contents=[p]) for i, p in enumerate(parts)
        ]
        streamed = [r async for r in client.ModelStreamInfer(iter(requests))]
        live = await client.ServerLive(
            pb.ServerLiveRequest(), metadata=(("x-key", "v"), ("x-raw-bin", b"\x00\xff"))
        )
    assert answer.id == "a" and answer.raw_output_contents == [big]
    assert [r.infer_response.id for r in streamed] == [r.id for r in requests]
    assert [r.infer_response.raw_output_contents for r in streamed] == [
        r.raw_input_contents for r in requests
    ]
    assert live.live is True


@KINDS
async def test_a_stream_answers_each_request_before_the_next_is_sent(kind: str) -> None:
    """Ping-pong on one stream: every answer must go out as soon as it is made."""
    async with serving(kind, Echo()) as (_, address), stub(address) as client:
        call = client.ModelStreamInfer()
        ids = []
        for i in range(20):
            await call.write(pb.ModelInferRequest(id=f"p{i}", raw_input_contents=[b"%d" % i]))
            answer = await asyncio.wait_for(call.read(), 10)
            ids.append(answer.infer_response.id)
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    assert ids == [f"p{i}" for i in range(20)]


@KINDS
async def test_errors_end_calls_with_the_status_grpc_aio_gives(kind: str) -> None:
    async with serving(kind, Echo()) as (_, address), stub(address) as client:
        codes = {}
        for rid in ("abort", "boom"):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await client.ModelInfer(pb.ModelInferRequest(id=rid))
            codes[rid] = (failed.value.code(), failed.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
            await client.ServerMetadata(pb.ServerMetadataRequest())
        with pytest.raises(grpc.aio.AioRpcError) as too_big:
            await client.ModelInfer(pb.ModelInferRequest(raw_input_contents=[b"x" * (LIMIT + 1)]))
    assert codes["abort"] == (grpc.StatusCode.INVALID_ARGUMENT, "100% wrong: é\nsecond line")
    assert codes["boom"][0] == grpc.StatusCode.UNKNOWN
    assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_an_unknown_method_and_a_compressed_message_are_unimplemented() -> None:
    async with serving("plaza", Echo()) as (_, address):
        async with grpc.aio.insecure_channel(address) as channel:
            unknown = channel.unary_unary("/nope.Service/Method")
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await unknown(b"")
        async with stub(address, compression=grpc.Compression.Gzip) as client:
            with pytest.raises(grpc.aio.AioRpcError) as compressed:
                await client.ModelInfer(pb.ModelInferRequest(raw_input_contents=[b"x" * 4096]))
        async with stub(address) as client:  # the server goes on serving
            answer = await client.ModelInfer(pb.ModelInferRequest(id="after"))
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert compressed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "compressed" in (compressed.value.details() or "")
    assert answer.id == "after"


@KINDS
async def test_a_deadline_or_a_cancel_stops_the_handler(kind: str) -> None:
    unary, stream = Echo(), Echo()
    async with serving(kind, unary) as (_, address), stub(address) as client:
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await client.ModelInfer(pb.ModelInferRequest(id="sleep"), timeout=0.5)
        await asyncio.wait_for(unary.cancelled.wait(), 10)
    async with serving(kind, stream) as (_, address), stub(address) as client:
        call = client.ModelStreamInfer(iter([pb.ModelInferRequest(id="sleep")]))
        await asyncio.wait_for(stream.started.wait(), 10)
        call.cancel()
        await asyncio.wait_for(stream.cancelled.wait(), 10)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_the_server_enforces_grpc_timeout_itself() -> None:
    """A client that sent ``grpc-timeout`` and waits on past it (no timer of its own) is
    answered DEADLINE_EXCEEDED by the server, whose handler is cancelled. The client here
    writes its frames by hand (HPACK by the ``hpack`` package)."""
    servicer = Echo()
    async with serving("plaza", servicer) as (_, address):
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        headers = [
            (":method", "POST"), (":scheme", "http"), (":authority", address),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "300m"),
        ]  # fmt: skip
        message = pb.ModelInferRequest(id="sleep").SerializeToString()
        body = b"\0" + len(message).to_bytes(4, "big") + message
        writer.write(
            http2.PREFACE
            + http2.frame(http2.SETTINGS, 0, 0)
            + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, hpack.Encoder().encode(headers))
            + http2.frame(http2.DATA, http2.END_STREAM, 1, body)
        )
        decoder, received, trailers = hpack.Decoder(), b"", None
        async with asyncio.timeout(10):
            while trailers is None:
                received += await reader.read(65536)
                while len(received) >= 9:
                    length = int.from_bytes(received[:3], "big")
                    if len(received) < 9 + length:
                        break
                    kind, flags, payload = received[3], received[4], received[9 : 9 + length]
                    received = received[9 + length :]
                    if kind == http2.HEADERS:
                        block = dict(decoder.decode(payload))
                        if flags & http2.END_STREAM:
                            trailers = block
        writer.close()
        await asyncio.wait_for(servicer.cancelled.wait(), 10)
    assert trailers["grpc-status"] == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])


async def test_a_connection_without_the_http2_preface_is_closed() -> None:
    table = methods_of(SERVICE, Echo(), pb_grpc.GRPCInferenceServiceServicer)
    server = GrpcServer(table, max_message_bytes=LIMIT, handshake_s=0.3)
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(10):  # the server's SETTINGS, then the close
            while await reader.read(65536):
                pass
        writer.close()
    finally:
        await server.stop(1.0)
    assert not server.connections


async def test_a_client_that_does_not_read_holds_its_answers_back() -> None:
    """A client that grants HTTP/2 windows without end but never reads: the server stops
    making answers once the socket's buffer is full, and does not queue them in memory."""
    servicer = Echo()
    table = methods_of(SERVICE, servicer, pb_grpc.GRPCInferenceServiceServicer)
    server = GrpcServer(table, max_message_bytes=LIMIT)
    port = await server.start("127.0.0.1", 0)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        huge = (1 << 31) - 1
        headers = [
            (":method", "POST"), (":scheme", "http"), (":authority", "x"),
            (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
            ("content-type", "application/grpc"), ("te", "trailers"),
        ]  # fmt: skip
        message = pb.ModelInferRequest(id="big").SerializeToString()
        body = (b"\0" + len(message).to_bytes(4, "big") + message) * 200  # 200 x 256 KiB asked
        writer.write(
            http2.PREFACE
            + http2.frame(http2.SETTINGS, 0, 0, struct.pack(">HI", http2.INITIAL_WINDOW_SIZE, huge))
            + http2.frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", huge - 65535))
            + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, hpack.Encoder().encode(headers))
            + http2.frame(http2.DATA, 0, 1, body)
        )
        await writer.drain()
        await wait_for(lambda: servicer.answered > 0, 10, "the first answers")
        (conn,) = server.connections
        assert conn.transport is not None
        # the transport's buffer fills up and pushes back: the handler waits from then on
        await wait_for(lambda: not conn._writable.is_set(), 10, "the transport to push back")
        answered = servicer.answered
        buffered = conn.transport.get_write_buffer_size()
        writer.close()
    finally:
        await server.stop(1.0)
    assert answered < 200
    assert buffered < 2 * len(BIG)  # at most about one answer past the transport's limit


async def test_a_stop_lets_the_calls_in_flight_finish_and_refuses_new_ones() -> None:
    servicer = Echo()
    async with serving("plaza", servicer) as (server, address), stub(address) as client:
        slow = asyncio.ensure_future(client.ModelInfer(pb.ModelInferRequest(id="held")))
        await asyncio.wait_for(servicer.started.wait(), 10)
        stopping = asyncio.ensure_future(server.stop(10))  # returns once the call is answered
        await wait_for(lambda: not server._server.is_serving(), 10, "the stop to begin")
        servicer.release.set()
        await asyncio.wait_for(stopping, 20)
        answer = await slow
        async with stub(address) as fresh:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await fresh.ServerLive(pb.ServerLiveRequest(), timeout=2)
    assert answer.id == "held"
    assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
