"""The gateway's own gRPC server (``gateway/grpc_server.py``) against grpc's own client,
side by side with grpc.aio serving the same servicer: what a call ends with must not
depend on which server answers it. The servicer here is a small one of this file's (an
echo), so these tests need no Kafka or Redis; the gateway's servicer over this server is
tested end to end in test_gateway_grpc.py.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import grpc
import hpack
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.gateway import grpc_health, http2
from plaza.gateway.grpc_front import SERVICE, InferenceServicer, server_options
from plaza.gateway.grpc_server import (
    KEEPALIVE,
    GrpcServer,
    methods_of,
    ping_policy,
    tcp_keepalive,
)
from plaza.gateway.shared_memory import CUDA_UNSUPPORTED, SharedMemoryRegions
from plaza.settings import GatewaySettings, PlazaSettings
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
async def serving(
    kind: str,
    servicer: pb_grpc.GRPCInferenceServiceServicer,
    health: grpc_health.HealthServicer | None = None,
    options: list[tuple[str, Any]] | None = None,
    pings: http2.PingPolicy | None = None,
) -> AsyncIterator[tuple[Any, str]]:
    """``servicer`` (and gRPC's health service, where given) on the gateway's server
    (plaza) or on grpc.aio (with ``options``, where given), as ``grpc_front.start_server``
    puts them, the plaza one with ``pings`` as its ping policy; yields (server, address)."""
    if kind == "plaza":
        table = methods_of(SERVICE, servicer, pb_grpc.GRPCInferenceServiceServicer)
        if health is not None:
            table.update(methods_of(grpc_health.SERVICE, health, object))
        server: Any = GrpcServer(table, max_message_bytes=LIMIT, pings=pings)
        port = await server.start("127.0.0.1", 0)
    else:
        options = options or [("grpc.max_receive_message_length", LIMIT)]
        server = grpc.aio.server(options=options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        if health is not None:
            server.add_generic_rpc_handlers((grpc_health.generic_handler(health),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        await server.stop(1.0)


@asynccontextmanager
async def stub(
    address: str, *, options: Sequence[tuple[str, Any]] = (), **kwargs: Any
) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    options = [("grpc.max_receive_message_length", 64 << 20), *options]
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


async def test_an_unknown_method_is_unimplemented() -> None:
    async with serving("plaza", Echo()) as (_, address):
        async with grpc.aio.insecure_channel(address) as channel:
            unknown = channel.unary_unary("/nope.Service/Method")
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await unknown(b"")
        async with stub(address) as client:  # the server goes on serving
            answer = await client.ModelInfer(pb.ModelInferRequest(id="after"))
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert answer.id == "after"


@KINDS
@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
async def test_compressed_requests_are_inflated_within_the_size_limit(
    kind: str, compression: grpc.Compression
) -> None:
    """What tritonclient's ``compression_algorithm`` sends: every request message
    compressed. A message that inflates past the limit (zeros: a few KiB on the wire) is
    refused as one that arrives that big."""
    data = bytes(range(256)) * 64
    async with serving(kind, Echo()) as (_, address):
        async with stub(address, compression=compression) as client:
            answer = await client.ModelInfer(
                pb.ModelInferRequest(id="z", raw_input_contents=[data])
            )
            requests = [
                pb.ModelInferRequest(id=f"s{i}", raw_input_contents=[data]) for i in range(5)
            ]
            streamed = [r.infer_response.id async for r in client.ModelStreamInfer(iter(requests))]
            with pytest.raises(grpc.aio.AioRpcError) as bomb:
                await client.ModelInfer(pb.ModelInferRequest(raw_input_contents=[bytes(LIMIT)]))
        async with stub(address) as client:  # and serves on
            after = await client.ModelInfer(pb.ModelInferRequest(id="after"))
    assert answer.id == "z" and answer.raw_output_contents == [data]
    assert streamed == [f"s{i}" for i in range(5)]
    assert bomb.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert after.id == "after"


@KINDS
async def test_the_health_service_answers_the_readiness_and_refuses_unknown_services(
    kind: str,
) -> None:
    """``grpc.health.v1.Health``, called as grpc_health_probe and Kubernetes call it: by
    path, with the request and answer as gRPC's health.proto lays them out (field 1)."""
    state = {"ready": True}

    async def ready() -> bool:
        return state["ready"]

    health = grpc_health.HealthServicer(ready)
    path = "/grpc.health.v1.Health/"
    async with (
        serving(kind, Echo(), health) as (_, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        check = channel.unary_unary(path + "Check")
        serving_now = await check(b"")  # HealthCheckRequest{service: ""}: nothing on the wire
        named = await check(b"\x0a\x1einference.GRPCInferenceService")
        state["ready"] = False
        not_serving = await check(b"\x0a\x00")  # service "" written out all the same
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await check(b"\x0a\x04nope")
        with pytest.raises(grpc.aio.AioRpcError) as watch:
            async for _ in channel.unary_stream(path + "Watch")(b""):
                pass
    assert serving_now == named == b"\x08\x01"  # status: SERVING (1)
    assert not_serving == b"\x08\x02"  # NOT_SERVING (2)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert watch.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _call_frames(address: str, extra: list[tuple[str, str]], body: bytes) -> bytes:
    """An HTTP/2 connection's opening and one ModelInfer call, written by hand (HPACK by
    the ``hpack`` package)."""
    headers = [
        (":method", "POST"), (":scheme", "http"), (":authority", address),
        (":path", "/inference.GRPCInferenceService/ModelInfer"),
        ("content-type", "application/grpc"), ("te", "trailers"), *extra,
    ]  # fmt: skip
    return (
        http2.PREFACE
        + http2.frame(http2.SETTINGS, 0, 0)
        + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, hpack.Encoder().encode(headers))
        + http2.frame(http2.DATA, http2.END_STREAM, 1, body)
    )


async def _trailers(address: str, frames: bytes) -> dict[str, str]:
    """Write ``frames`` on a new connection; the headers that end stream 1 (with the
    response headers before them, where the answer is trailers-only)."""
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(frames)
    decoder, received = hpack.Decoder(), b""
    seen: dict[str, str] = {}
    try:
        async with asyncio.timeout(10):
            while True:
                chunk = await reader.read(65536)
                assert chunk, "the server closed before the call ended"
                received += chunk
                while len(received) >= 9:
                    length = int.from_bytes(received[:3], "big")
                    if len(received) < 9 + length:
                        break
                    kind, flags, payload = received[3], received[4], received[9 : 9 + length]
                    received = received[9 + length :]
                    if kind == http2.HEADERS:
                        seen.update(decoder.decode(payload))
                        if flags & http2.END_STREAM:
                            return seen
    finally:
        writer.close()


async def test_an_encoding_not_served_is_unimplemented_and_the_accepted_ones_are_named() -> None:
    message = pb.ModelInferRequest(id="x").SerializeToString()
    framed = b"\1" + len(message).to_bytes(4, "big") + message  # flagged, not compressed
    async with serving("plaza", Echo()) as (_, address):
        snappy = await _trailers(address, _call_frames(address, [("grpc-encoding", "snappy")], b""))
        unflagged = await _trailers(address, _call_frames(address, [], framed))
        garbled = await _trailers(
            address, _call_frames(address, [("grpc-encoding", "gzip")], framed)
        )
    assert snappy["grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0])
    assert "snappy" in snappy["grpc-message"]
    assert snappy["grpc-accept-encoding"] == "identity,deflate,gzip"
    # flagged compressed with no grpc-encoding, or bytes that do not inflate: INTERNAL
    assert unflagged["grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0])
    assert garbled["grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0])


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
    answered DEADLINE_EXCEEDED by the server, whose handler is cancelled."""
    servicer = Echo()
    message = pb.ModelInferRequest(id="sleep").SerializeToString()
    body = b"\0" + len(message).to_bytes(4, "big") + message
    async with serving("plaza", servicer) as (_, address):
        frames = _call_frames(address, [("grpc-timeout", "300m")], body)
        trailers = await _trailers(address, frames)
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


async def test_every_connection_has_tcp_keepalive_with_the_servers_timing() -> None:
    """An idle gRPC connection is never closed for idling; TCP keepalive finds a client
    that went without a FIN."""
    async with serving("plaza", Echo()) as (server, address), stub(address) as s:
        await s.ServerLive(pb.ServerLiveRequest())
        (conn,) = server.connections
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        for option, value in KEEPALIVE:
            assert sock.getsockopt(socket.IPPROTO_TCP, option) == value


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


async def test_a_connection_has_the_tcp_keepalive_timing_it_is_given() -> None:
    """The gateway's server takes ``gateway.grpc_keepalive_time_ms`` and ``_timeout_ms``
    as its TCP keepalive's (``grpc_front.start_server``)."""
    timing = tcp_keepalive(5000, 2000)
    table = methods_of(SERVICE, Echo(), pb_grpc.GRPCInferenceServiceServicer)
    server = GrpcServer(table, max_message_bytes=LIMIT, tcp_keepalive=timing)
    port = await server.start("127.0.0.1", 0)
    try:
        async with stub(f"127.0.0.1:{port}") as s:
            await s.ServerLive(pb.ServerLiveRequest())
            (conn,) = server.connections
            assert conn.transport is not None
            sock = conn.transport.get_extra_info("socket")
            got = {option: sock.getsockopt(socket.IPPROTO_TCP, option) for option, _ in timing}
    finally:
        await server.stop(1.0)
    assert got == {socket.TCP_KEEPIDLE: 5, socket.TCP_KEEPINTVL: 2, socket.TCP_KEEPCNT: 3}


PINGING_CLIENT = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
"""tritonclient's KeepAliveOptions(keepalive_time_ms=1000, ...): a ping every second."""


@KINDS
async def test_a_client_pinging_every_second_keeps_its_stream_when_the_settings_allow_it(
    kind: str,
) -> None:
    """grpc.aio with the gateway's options (``server_options``), its ping policy opened
    up by the settings, keeps a stream on which nothing is sent between a client's
    pings a second apart (its defaults, Triton's, answer GOAWAY too_many_pings), and so
    does the gateway's own server with the same settings (``ping_policy``)."""
    gateway = GatewaySettings(
        grpc_keepalive_permit_without_calls=True,
        grpc_http2_min_recv_ping_interval_without_data_ms=100,
    )
    options = server_options(PlazaSettings(gateway=gateway))
    requests: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()

    async def sent() -> AsyncIterator[pb.ModelInferRequest]:
        while (request := await requests.get()) is not None:
            yield request

    async with (
        serving(kind, Echo(), options=options, pings=ping_policy(gateway)) as (_, address),
        stub(address, options=PINGING_CLIENT) as client,
    ):
        call = client.ModelStreamInfer(sent())
        await requests.put(pb.ModelInferRequest(id="before"))
        first = await asyncio.wait_for(call.read(), 10)
        await asyncio.sleep(6)  # the idle under test: about 6 pings, nothing else sent
        await requests.put(pb.ModelInferRequest(id="after"))
        second = await asyncio.wait_for(call.read(), 10)
        await requests.put(None)
    assert (first.infer_response.id, second.infer_response.id) == ("before", "after")


def _gateway_servicer() -> InferenceServicer:
    """The gateway's servicer on what its shared memory calls use alone: the settings and
    the regions (no Kafka or Redis behind it)."""
    regions = SharedMemoryRegions(allowed=False)
    return InferenceServicer(SimpleNamespace(settings=PlazaSettings(), shm=regions))  # type: ignore[arg-type]


@KINDS
async def test_the_status_of_a_region_not_registered_is_not_found(kind: str) -> None:
    """As Triton: NOT_FOUND with its words; unregistering one is no error."""
    async with serving(kind, _gateway_servicer()) as (_, address), stub(address) as client:
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await client.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="gone"))
        await client.SystemSharedMemoryUnregister(
            pb.SystemSharedMemoryUnregisterRequest(name="gone")
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Unable to find system shared memory region: 'gone'" in str(missing.value.details())


@KINDS
async def test_cuda_shared_memory_calls_are_unimplemented_with_plazas_words(kind: str) -> None:
    """The same status and message from both servers (grpc.aio's own would name the base
    class's NotImplementedError)."""
    refusals = []
    async with serving(kind, _gateway_servicer()) as (_, address), stub(address) as client:
        for call, request in [
            (client.CudaSharedMemoryStatus, pb.CudaSharedMemoryStatusRequest()),
            (client.CudaSharedMemoryRegister, pb.CudaSharedMemoryRegisterRequest(name="g")),
            (client.CudaSharedMemoryUnregister, pb.CudaSharedMemoryUnregisterRequest()),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(request)
            refusals.append((refused.value.code(), refused.value.details()))
    assert refusals == [(grpc.StatusCode.UNIMPLEMENTED, CUDA_UNSUPPORTED)] * 3
