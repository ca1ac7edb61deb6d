"""The gateway's HTTP/1.1 server at its edges, over loopback sockets: a client that
half-closes (read as gone), a head (or a chunk's size line, or trailers) trickled a
byte at a time, and requests without a Host header or with two (RFC 9112 §3.2); the
clients the project relies on (httpx, aiohttp, tritonclient's) still get through."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import orjson
import pytest
import tritonclient.http as triton_http

from tests.support import wait_for
from tests.unit.test_http_server import post, read_response, server

# -- a client that half-closes ---------------------------------------------------------


async def test_a_fin_after_a_request_reads_as_the_client_gone() -> None:
    """A half-close is the client leaving, as Go's net/http and uvicorn read it: the request
    in flight is not answered (the gateway cancels what a connection that closes sent)."""
    async with server() as (srv, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/x?delay=5", b"abc"))
        await wait_for(lambda: bool(srv.connections), 5, "the connection taken in")
        writer.write_eof()  # shutdown(SHUT_WR)
        assert await asyncio.wait_for(reader.read(), 3) == b""  # the close, no answer
        writer.close()
        await wait_for(lambda: not srv.connections, 5, "the server's side closed")


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 9\r\n\r\nabc"],
    ids=["idle", "cut"],
)
async def test_a_fin_with_no_whole_request_waiting_closes_at_once(sent: bytes) -> None:
    async with server() as (srv, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # no answer, the close
        writer.close()
        await wait_for(lambda: not srv.connections, 5, "the server's side closed")


# -- a head trickled a byte at a time -----------------------------------------------------

_TRICKLED = {
    "head": (b"GET /h HTTP/1.1\r\nhost: t\r\nx-slow: ", b"a"),
    "chunk size line": (
        b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n1;ext=",
        b"a",
    ),
    "trailers": (
        b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n",
        b"x-t: 1\r\n",
    ),
}


@pytest.mark.parametrize("start, drip", _TRICKLED.values(), ids=_TRICKLED.keys())
async def test_a_trickled_head_is_408_and_closed(start: bytes, drip: bytes) -> None:
    """A byte (a trailer line) every 0.05 s: each gap well inside stall_s, but the head
    never ends; it is answered 408 once it has taken stall_s."""
    async with server(keep_alive_s=0.05, stall_s=0.5, max_head_bytes=1 << 20) as (srv, port):
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
            status, headers, body = await asyncio.wait_for(read_response(reader), 10)
        finally:
            dripping.cancel()
        assert (status, headers["connection"]) == (408, "close")
        assert orjson.loads(body)["code"] == "request_timeout"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await wait_for(lambda: not srv.connections, 5, "the server's side closed")


# -- Host ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /h HTTP/1.1\r\n\r\n",
        b"GET /h HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        b"GET /h HTTP/1.0\r\nhost: a\r\nHost: b\r\n\r\n",
        b"GET /h HTTP/1.1\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    ],
    ids=["1.1 without Host", "1.1 with two", "1.0 with two", "an upgrade without Host"],
)
async def test_a_request_without_its_host_or_with_two_is_400_and_closed(
    request_head: bytes,
) -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_head + post("/after", b""))  # nothing after it is read
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (status, headers["connection"]) == (400, "close")
        assert "Host" in orjson.loads(body)["error"]
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_http_1_0_without_host_is_answered() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /old HTTP/1.0\r\n\r\n")
        status, _, body = await asyncio.wait_for(read_response(reader), 5)
        assert (status, body) == (200, b"GET /old 0 b''")
        writer.close()


async def test_the_projects_http_clients_send_their_host() -> None:
    """httpx (the tests'), aiohttp (the load generator's) and tritonclient's HTTP client."""
    import aiohttp

    async with server() as (_, port):
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"{url}/httpx", content=b"1")
        assert (answer.status_code, answer.content) == (200, b"POST /httpx 1 b'1'")
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/aiohttp", data=b"22") as got,
        ):
            assert (got.status, await got.read()) == (200, b"POST /aiohttp 2 b'22'")

        def triton_live() -> bool:
            client = triton_http.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                return bool(client.is_server_live())  # GET /v2/health/live: 200 is live
            finally:
                client.close()

        assert await asyncio.get_running_loop().run_in_executor(None, triton_live)
