"""The HTTP server's own answers (414, 400, 413, 431, 408) on HTTP/1.0 and 1.1: each says
what it does with the connection (``keep-alive`` to a 1.0 client it keeps, ``close`` when
it closes) and does it; and a request body trickled in, each gap inside ``stall_s``, is
answered 408 once it has taken ``max_body_s``, over loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import orjson
import pytest

from plaza.gateway.http_server import MAX_URL_BYTES, HttpServer
from tests.support import wait_for
from tests.unit.test_http_server import LIMIT, echo, read_response


@asynccontextmanager
async def serving(
    stall_s: float = 30.0, max_body_s: float = 60.0
) -> AsyncIterator[tuple[HttpServer, int]]:
    srv = HttpServer(
        echo,
        max_body_bytes=LIMIT,
        keep_alive_s=0.05,  # the timer that watches a request half received fires soon
        stall_s=stall_s,
        max_body_s=max_body_s,
        max_head_bytes=256,
    )
    port = await srv.start("127.0.0.1", 0)
    try:
        yield srv, port
    finally:
        await srv.stop(1.0)


def head(version: str, target: str = "/x", *extra: str) -> bytes:
    lines = [f"POST {target} HTTP/{version}", "host: t", *extra]
    if version == "1.0":
        lines.append("connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n").encode()


def whole(version: str, target: str = "/x", body: bytes = b"") -> bytes:
    return head(version, target, f"content-length: {len(body)}") + b"\r\n" + body


# -- the server's own answers say what happens to the connection ---------------------------

Sent = Callable[[str], bytes]  # a request in an HTTP version

_KEPT: dict[str, tuple[Sent, int, str]] = {
    "414 uri_too_long": (lambda v: whole(v, "/" + "a" * MAX_URL_BYTES), 414, "uri_too_long"),
    "400 target": (lambda v: whole(v, "http:///x"), 400, "http_error"),
}


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("sent, status, code", _KEPT.values(), ids=_KEPT.keys())
async def test_an_answer_that_keeps_the_connection_says_so_to_http_1_0(
    version: str, sent: Sent, status: int, code: str
) -> None:
    async with serving() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent(version) + whole(version, "/next"))
        got, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (got, orjson.loads(body)["code"]) == (status, code)
        # HTTP/1.0 closes unless told keep-alive; HTTP/1.1 keeps unless told close
        assert headers.get("connection") == ("keep-alive" if version == "1.0" else None)
        got, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (got, body) == (200, b"POST /next 0 b''")  # the connection went on
        assert headers.get("connection") == ("keep-alive" if version == "1.0" else None)
        writer.close()


_CLOSED: dict[str, tuple[Sent, int, str]] = {
    "413 body read": (lambda v: whole(v, "/big", b"y" * (LIMIT + 1)), 413, "payload_too_large"),
    "431 head": (lambda v: head(v, "/h", "x-long: " + "v" * 512), 431, "headers_too_large"),
    "408 stalled body": (lambda v: whole(v, "/s", b"abcd")[:-2], 408, "request_timeout"),
    "408 stalled head": (lambda v: head(v, "/s"), 408, "request_timeout"),
}


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("sent, status, code", _CLOSED.values(), ids=_CLOSED.keys())
async def test_an_answer_that_closes_the_connection_says_close_and_closes(
    version: str, sent: Sent, status: int, code: str
) -> None:
    async with serving(stall_s=0.3) as (srv, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent(version))
        got, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (got, orjson.loads(body)["code"], headers["connection"]) == (status, code, "close")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()
        await wait_for(lambda: not srv.connections, 5, "the server's side closed")


# -- a body trickled in has an overall deadline ----------------------------------------------

_DRIPPED = {
    "content-length": (whole("1.1", "/d", b"x" * 1000)[:-1000], b"x"),
    "chunked": (head("1.1", "/d", "transfer-encoding: chunked") + b"\r\n", b"1\r\nx\r\n"),
}


@pytest.mark.parametrize("start, drip", _DRIPPED.values(), ids=_DRIPPED.keys())
async def test_a_trickled_body_is_408_and_closed_once_it_took_max_body_s(
    start: bytes, drip: bytes
) -> None:
    """A byte every 0.05 s: each gap far inside stall_s, the body never whole; answered 408
    once it has taken max_body_s (the stall alone would never end it)."""
    async with serving(stall_s=0.5, max_body_s=0.6) as (srv, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(start)

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                while not writer.is_closing():
                    writer.write(drip)
                    await writer.drain()
                    await asyncio.sleep(0.05)  # the client's pace, not a synchronisation

        dripping = asyncio.create_task(trickle())
        try:
            status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        finally:
            dripping.cancel()
        assert (status, headers["connection"]) == (408, "close")
        answer = orjson.loads(body)
        assert (answer["code"], answer["error"]) == (
            "request_timeout",
            "the request's body took over 0.6 s",
        )
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await wait_for(lambda: not srv.connections, 5, "the server's side closed")


async def test_the_body_deadline_is_each_request_s_own() -> None:
    """Two bodies on one connection, each sent in two parts: the second's deadline starts
    at its own first bytes, not the first's."""
    async with serving(stall_s=5.0, max_body_s=1.0) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path in ("/one", "/two"):
            sent = whole("1.1", path, b"abcd")
            writer.write(sent[:-2])
            await asyncio.sleep(0.6)  # the client's pace: 1.2 s in all, over max_body_s
            writer.write(sent[-2:])
            status, _, body = await asyncio.wait_for(read_response(reader), 5)
            assert (status, body) == (200, f"POST {path} 4 b'abcd'".encode())
        writer.close()
