"""The gateway's own gRPC server (``gateway/grpc_server.py``) bounds each request message's
time from its first bytes to its last (``max_message_s``, the HTTP front's ``max_body_s``):
a message dripped one byte at a time, each gap well inside ``stall_s``, ends its call
DEADLINE_EXCEEDED, as a stalled one does; a stream is timed message by message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.gateway import http2
from plaza.gateway.grpc_front import SERVICE
from plaza.gateway.grpc_server import GrpcServer, methods_of
from plaza.gateway.http_server import MAX_BODY_S
from tests.integration.test_grpc_server import LIMIT, Echo
from tests.integration.test_grpc_server_limits import INFER, STREAM, _message, _Wire, _wire

DRIP_S = 0.02
"""The gap between the dripped bytes: far inside ``stall_s``, so no stall ends the call."""


@contextlib.asynccontextmanager
async def _server(max_message_s: float) -> AsyncIterator[str]:
    table = methods_of(SERVICE, Echo(), pb_grpc.GRPCInferenceServiceServicer)
    server = GrpcServer(table, max_message_bytes=LIMIT, stall_s=5.0, max_message_s=max_message_s)
    port = await server.start("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(1.0)


async def _drip(wire: _Wire, stream_id: int, message: bytes) -> None:
    """Send ``message`` on ``stream_id`` one byte at a time, ``DRIP_S`` apart (the pace of
    a trickling client, not a wait for anything)."""
    for at in range(len(message)):
        wire.data(stream_id, message[at : at + 1])
        await wire.writer.drain()
        await asyncio.sleep(DRIP_S)


async def test_the_bound_defaults_to_the_http_fronts_body_bound() -> None:
    assert GrpcServer({}, max_message_bytes=LIMIT).max_message_s == MAX_BODY_S


async def test_a_dripped_request_message_ends_its_call_deadline_exceeded() -> None:
    """A unary call's message and a stream's second message, each dripped byte by byte
    (it would take 20 s whole), end DEADLINE_EXCEEDED; another stream, whose messages come
    whole (its life longer than the bound), goes on and is answered."""
    long = _message("drip", b"d" * 1000)
    async with _server(max_message_s=0.4) as address, _wire(address) as wire:
        wire.call(1, STREAM)
        wire.data(1, _message("s0"))
        wire.call(3, INFER)
        wire.call(5, STREAM)
        wire.data(5, _message("first"))  # whole: answered, then the next one drips
        drips = [asyncio.create_task(_drip(wire, sid, long)) for sid in (3, 5)]
        try:
            async with asyncio.timeout(5):  # without the bound these calls never end
                await wire.until(lambda: {3, 5} <= wire.ended, "the dripped calls' end")
        finally:
            for task in drips:
                task.cancel()
            await asyncio.gather(*drips, return_exceptions=True)
        alive = 1 in wire.ended
        wire.data(1, _message("s1"), ended=True)  # the stream outlived the bound, whole
        await wire.until(lambda: 1 in wire.ended, "the whole stream's answers")
    assert not alive
    deadline = str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    for sid in (3, 5):
        assert wire.headers[sid]["grpc-status"] == deadline, wire.headers[sid]
        assert "not whole 0.4 s after its first bytes" in wire.headers[sid]["grpc-message"]
        assert wire.resets[sid] == http2.NO_ERROR
    assert wire.headers[1]["grpc-status"] == "0", wire.headers[1]
