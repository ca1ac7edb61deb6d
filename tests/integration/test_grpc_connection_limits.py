"""The gateway's own gRPC server (``gateway/grpc_server.py``) against one connection that
would hold the gateway's memory or its calls: unfinished request messages on many
streams (past the connection's ``max_buffered_bytes`` their windows are held back),
request messages that stop coming (DEADLINE_EXCEEDED after ``stall_s``), binary metadata
that is not base64 (INVALID_ARGUMENT, nothing logged); and, through the whole gateway, a
stop that gives a gRPC call in flight the time an HTTP one gets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from aiokafka.structs import TopicPartition
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from plaza.gateway import http2
from plaza.gateway.grpc_front import SERVICE
from plaza.gateway.grpc_server import GrpcServer, methods_of
from plaza.settings import PlazaSettings
from tests.integration.test_grpc_server import LIMIT, Echo
from tests.integration.test_grpc_server_limits import INFER, STREAM, _message, _Wire, _wire
from tests.support import gateway_fronts, group_offsets, wait_for

FRAME = 1 << 14
LIVE = "/inference.GRPCInferenceService/ServerLive"


def _code(code: grpc.StatusCode) -> str:
    return str(code.value[0])


@asynccontextmanager
async def _server(
    servicer: Echo, *, max_buffered_bytes: int | None = None, stall_s: float = 30.0
) -> AsyncIterator[GrpcServer]:
    table = methods_of(SERVICE, servicer, pb_grpc.GRPCInferenceServiceServicer)
    server = GrpcServer(
        table, max_message_bytes=LIMIT, max_buffered_bytes=max_buffered_bytes, stall_s=stall_s
    )
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop(1.0)


def _address(server: GrpcServer) -> str:
    assert server._server is not None
    return f"127.0.0.1:{server._server.sockets[0].getsockname()[1]}"


def _send(wire: _Wire, stream_id: int, data: bytes, ended: bool = False) -> None:
    for at in range(0, len(data), FRAME):
        last = at + FRAME >= len(data)
        wire.data(stream_id, data[at : at + FRAME], ended=ended and last)


def _unfinished(wire: _Wire, stream_id: int, path: str, sent: int, message: bytes) -> None:
    """A call of whose request ``message`` only the first ``sent`` bytes come."""
    wire.call(stream_id, path)
    _send(wire, stream_id, message[:sent])


# -- unfinished messages past the connection's limit --------------------------------------


async def test_past_the_connections_limit_calls_are_held_back_by_their_windows() -> None:
    """Four calls each send 1 MiB of a 1.25 MiB message (what their first window allows);
    the connection may hold 2.5 MiB: the calls past it get no window back (flow control
    holds their clients), none is refused; the oldest call's message completes and is
    answered, and once the connection is under its limit again every call gets its window
    back and is answered in turn."""
    limit = (2 << 20) + (1 << 19)
    body = pb.ModelInferRequest(id="big", model_name="m" * (5 << 18))  # its answer is small
    message = b"\0" + body.ByteSize().to_bytes(4, "big") + body.SerializeToString()
    server = _server(Echo(), max_buffered_bytes=limit)
    async with server as served, _wire(_address(served)) as wire:
        for sid in (1, 3, 5, 7):
            _unfinished(wire, sid, INFER, 1 << 20, message)
        (conn,) = served.connections
        await wait_for(lambda: conn.unread == 4 << 20, 10, "the four calls' bytes held")
        await wire.until(lambda: 3 in wire.windows, "the window of a call under the limit")
        assert 7 not in wire.windows  # it came past the limit: its window is withheld
        for sid in (1, 3):  # the oldest first: each completes as the favoured one
            _send(wire, sid, message[1 << 20 :], ended=True)
            await wire.until(lambda sid=sid: sid in wire.ended, f"call {sid}'s answer")
        await wire.until(lambda: 7 in wire.windows, "the withheld window, under the limit")
        for sid in (5, 7):
            _send(wire, sid, message[1 << 20 :], ended=True)
        await wire.until(lambda: {5, 7} <= wire.ended, "the held calls' answers")
    for sid in (1, 3, 5, 7):
        assert wire.headers[sid]["grpc-status"] == "0", wire.headers[sid]
    assert not wire.resets


# -- request messages that stop coming ----------------------------------------------------


async def test_a_request_message_that_stops_coming_ends_deadline_exceeded() -> None:
    """Unary calls with half a message or none, and a streaming call with half a message,
    end DEADLINE_EXCEEDED once nothing more came for stall_s; a streaming call idle
    between whole messages, and a unary call whose handler works, are not ended."""
    servicer = Echo()
    async with _server(servicer, stall_s=0.5) as server, _wire(_address(server)) as wire:
        wire.call(1, STREAM)
        wire.data(1, _message("s0"))  # whole, answered; then the stream idles
        wire.call(3, INFER)
        wire.data(3, _message("held"))  # whole: its handler waits for the test
        _unfinished(wire, 5, INFER, 100, _message("half", b"h" * 1000))
        wire.call(7, INFER)  # no message at all
        _unfinished(wire, 9, STREAM, 100, _message("half", b"h" * 1000))
        stalled = {5, 7, 9}
        await wire.until(lambda: stalled <= wire.ended, "the stalled calls' end")
        alive = {1, 3} & wire.ended
        servicer.release.set()
        wire.data(1, _message("s1"), ended=True)
        await wire.until(lambda: {1, 3} <= wire.ended, "the live calls' answers")
    assert not alive
    for sid in sorted(stalled):
        assert wire.headers[sid]["grpc-status"] == _code(grpc.StatusCode.DEADLINE_EXCEEDED)
        assert "no bytes of the request message came" in wire.headers[sid]["grpc-message"]
        assert wire.resets[sid] == http2.NO_ERROR
    assert wire.headers[1]["grpc-status"] == wire.headers[3]["grpc-status"] == "0"


# -- binary metadata that is not base64 -----------------------------------------------------


@pytest.mark.parametrize("value", ["a", "!!!!", "Y Q=", "YWJj*"])
async def test_binary_metadata_that_is_not_base64_ends_the_call_invalid_argument(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    request = pb.ServerLiveRequest().SerializeToString()
    message = b"\0" + len(request).to_bytes(4, "big") + request
    async with _server(Echo()) as server, _wire(_address(server)) as wire:
        wire.call(1, LIVE, ("x-trace-bin", value))
        wire.data(1, message, ended=True)
        wire.call(3, LIVE, ("x-raw-bin", "AP8"))  # base64 without its padding: read
        wire.data(3, message, ended=True)
        await wire.until(lambda: {1, 3} <= wire.ended, "both calls' ends")
    assert wire.headers[1]["grpc-status"] == _code(grpc.StatusCode.INVALID_ARGUMENT)
    assert "'x-trace-bin' is not base64" in wire.headers[1]["grpc-message"]
    assert wire.headers[3]["grpc-status"] == "0"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- a stop, through the whole gateway ------------------------------------------------------


async def test_a_stop_gives_a_grpc_call_in_flight_the_time_an_http_one_gets(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    """No worker serves the model, so the call waits out its sync_timeout_s (6 s, past
    the 5 s a stop used to give gRPC calls): stopped meanwhile, the gateway still answers
    it, with its timeout, before it closes."""
    settings = settings_for("identity", sync_timeout_s=6.0)
    topic = settings.names.request_topic("identity")
    partitions = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]

    async def published() -> bool:
        ends = await group_offsets(settings, "identity", partitions)
        return sum(end for _, end in ends.values()) > 0

    item = aioclient.InferInput("INPUT0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    async with gateway_fronts(settings) as gw:
        client = aioclient.InferenceServerClient(gw.grpc_address)
        call = asyncio.ensure_future(client.infer("identity", [item]))
        await wait_for(published, 20, "the request's publish")
    # the stop has waited for the call: its answer came before the connection closed
    with pytest.raises(InferenceServerException) as caught:
        await asyncio.wait_for(call, 20)
    await client.close()
    assert caught.value.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED)
