"""The gateway's HTTP/1.1 server over loopback sockets, with raw bytes as the client:
keep-alive, pipelining in order, body limits, chunked bodies and their trailers, Expect:
100-continue, Upgrade, HEAD, HTTP/1.0, malformed requests, idle connections and the stop's
drain; and, on a fake transport, any run of requests and garbage cut anywhere (hypothesis)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plaza.gateway.http_server import HttpProtocol, HttpRequest, HttpResponse, HttpServer

LIMIT = 1024


async def echo(request: HttpRequest) -> HttpResponse:
    """Answers what it was asked; a ``delay`` query sleeps first; ``/boom`` raises;
    ``/headers`` answers the headers it got, as JSON."""
    if request.path == "/boom":
        raise RuntimeError("boom")
    if request.path == "/headers":
        return HttpResponse(200, orjson.dumps(request.headers), "application/json")
    if request.query.startswith("delay="):
        await asyncio.sleep(float(request.query.split("=", 1)[1]))
    text = f"{request.method} {request.path} {len(request.body)} {request.body[:16]!r}"
    return HttpResponse(200, text.encode(), "text/plain", [("x-version", request.http_version)])


@asynccontextmanager
async def server(
    keep_alive_s: float = 5.0, stall_s: float = 30.0, max_head_bytes: int = 1 << 20
) -> AsyncIterator[tuple[HttpServer, int]]:
    srv = HttpServer(
        echo,
        max_body_bytes=LIMIT,
        keep_alive_s=keep_alive_s,
        stall_s=stall_s,
        max_head_bytes=max_head_bytes,
    )
    port = await srv.start("127.0.0.1", 0)
    try:
        yield srv, port
    finally:
        await srv.stop(1.0)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"])) if status != 100 else b""
    return status, headers, body


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: t", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_keep_alive_answers_several_requests_on_one_connection() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(3):
            writer.write(post(f"/r{i}", b"x" * i))
            status, headers, body = await read_response(reader)
            assert (status, body) == (200, f"POST /r{i} {i} {b'x' * i!r}".encode())
            assert "connection" not in headers
        writer.close()


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # the first is the slowest: answered concurrently, it would come last
        writer.write(post("/a?delay=0.2", b"") + post("/b?delay=0", b"") + post("/c", b""))
        paths = [(await read_response(reader))[2].split()[1] for _ in range(3)]
        assert paths == [b"/a", b"/b", b"/c"]
        writer.close()


async def test_a_declared_body_over_the_limit_is_413_and_the_connection_closes() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/big", b"y" * (LIMIT + 1)))
        status, headers, body = await read_response(reader)
        assert status == 413 and b"payload_too_large" in body
        assert headers["connection"] == "close"
        assert await reader.read() == b""  # closed by the server
        writer.close()


async def test_expect_100_continue_over_the_limit_is_413_before_the_body() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            b"POST /big HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n"
            b"expect: 100-continue\r\n\r\n" % (LIMIT * 1000)
        )
        writer.write(head)  # and no body: a client that expects waits for an answer first
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert status == 413 and b"payload_too_large" in body
        assert headers["connection"] == "close"
        assert await reader.read() == b""
        writer.close()


async def test_a_chunked_body_is_decoded_and_bounded() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        chunked = b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(chunked + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /c 5 b'abcde'")
        big = b"%x\r\n%s\r\n" % (LIMIT, b"z" * LIMIT)
        writer.write(chunked + big + big + b"0\r\n\r\n")  # two chunks: over the limit
        status, _, _ = await read_response(reader)
        assert status == 413
        writer.close()


async def test_headers_over_the_head_limit_are_431_and_closed() -> None:
    async with server(max_head_bytes=4096) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /h HTTP/1.1\r\nhost: t\r\nx-long: ")
        for _ in range(64):  # a header value that never ends, 1 KiB a write
            if reader.at_eof() or writer.is_closing():
                break
            try:
                writer.write(b"v" * 1024)
                await writer.drain()
            except ConnectionError:  # the server answered and closed: its answer is read
                break
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (status, headers["connection"]) == (431, "close")
        assert orjson.loads(body)["code"] == "headers_too_large"
        writer.close()


async def test_trailers_are_dropped_not_merged_into_the_headers() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /headers HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
        trailers = b"content-encoding: gzip\r\nx-trailer: 1\r\n\r\n"
        writer.write(head + b"3\r\nabc\r\n0\r\n" + trailers + post("/after", b""))
        status, _, body = await read_response(reader)
        assert status == 200
        assert orjson.loads(body) == {"host": "t", "transfer-encoding": "chunked"}
        assert (await read_response(reader))[2] == b"POST /after 0 b''"
        writer.close()


@pytest.mark.parametrize(
    "trailers",
    [b"x-long: " + b"v" * 8192, b"".join(b"x-t%d: %s\r\n" % (i, b"v" * 1000) for i in range(8))],
    ids=["one long", "many"],
)
async def test_trailers_over_the_head_limit_are_431_and_closed(trailers: bytes) -> None:
    async with server(max_head_bytes=4096) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /t HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(head + b"1\r\nx\r\n0\r\n" + trailers)  # and the trailers never end
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (status, headers["connection"]) == (431, "close")
        assert orjson.loads(body)["code"] == "headers_too_large"
        assert await reader.read() == b""
        writer.close()


async def test_a_large_body_read_together_with_its_head_is_not_a_long_head() -> None:
    async with server(max_head_bytes=256) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/b", b"z" * 1000))  # head and body in one write, far over 256
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /b 1000 b'zzzzzzzzzzzzzzzz'")
        writer.close()


async def test_expect_100_continue_gets_the_interim_answer_first() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
        writer.write(head)
        assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
        writer.write(b"data")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /e 4 b'data'")
        writer.close()


async def test_100_continue_comes_after_an_earlier_answer_not_ahead_of_it() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
        writer.write(post("/first?delay=0.2", b"") + head)  # /e comes while /first is answered
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /first 0 b''")  # not a 100 meant for /e
        continued = b"HTTP/1.1 100 Continue\r\n\r\n"
        assert await reader.readexactly(len(continued)) == continued  # /e's turn: its 100
        writer.write(b"data")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /e 4 b'data'")
        writer.close()


async def test_no_100_continue_once_the_body_came_without_it() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
        # a client that tired of waiting: the body comes before /first is answered
        writer.write(post("/first?delay=0.2", b"") + head + b"data")
        assert (await read_response(reader))[::2] == (200, b"POST /first 0 b''")
        assert (await read_response(reader))[::2] == (200, b"POST /e 4 b'data'")  # no 100
        writer.close()


async def test_100_continue_is_not_sent_to_http_1_0() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST /e HTTP/1.0\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
        writer.write(head + b"data")
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"POST /e 4 b'data'")
        assert await reader.read() == b""  # the answer, its close, and nothing else
        writer.close()


_UPGRADES = {
    "websocket": (
        b"GET /a HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
        b"GET /a 0 b''",
    ),
    "h2c with a body": (  # as curl --http2 -d sends it
        post(
            "/a", b"{}", "connection: Upgrade, HTTP2-Settings", "upgrade: h2c", "http2-settings: A"
        ),
        b"POST /a 2 b'{}'",
    ),
}


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "one by one"])
@pytest.mark.parametrize("upgrade, echoed", _UPGRADES.values(), ids=_UPGRADES.keys())
async def test_an_upgrade_is_ignored_and_the_connection_goes_on(
    upgrade: bytes, echoed: bytes, pipelined: bool
) -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((upgrade + post("/next", b"")) if pipelined else upgrade)
        first = await read_response(reader)
        if not pipelined:
            writer.write(post("/next", b""))
        second = await read_response(reader)
        assert [(status, body) for status, _, body in (first, second)] == [
            (200, echoed),
            (200, b"POST /next 0 b''"),
        ]
        assert "connection" not in first[1] and "connection" not in second[1]
        writer.close()


async def test_head_has_the_length_and_no_body() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD /h HTTP/1.1\r\nhost: t\r\n\r\nGET /g HTTP/1.1\r\nhost: t\r\n\r\n")
        status_line = await reader.readline()
        assert status_line == b"HTTP/1.1 200 OK\r\n"
        headers = []
        while (line := await reader.readline()) != b"\r\n":
            headers.append(line)
        assert b"content-length: %d\r\n" % len(b"HEAD /h 0 b''") in headers
        status, _, body = await read_response(reader)  # the next answer follows at once
        assert (status, body) == (200, b"GET /g 0 b''")
        writer.close()


async def test_http_1_0_is_answered_and_closed() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /old HTTP/1.0\r\n\r\n")
        status, headers, _ = await read_response(reader)
        assert (status, headers["x-version"], headers["connection"]) == (200, "1.0", "close")
        assert await reader.read() == b""
        writer.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
        b"CONNECT example.org:443 HTTP/1.1\r\nhost: example.org:443\r\n\r\n",
    ],
    ids=["not HTTP", "bad header", "CONNECT"],
)
async def test_a_malformed_or_connect_request_is_400_and_closed(garbage: bytes) -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        status, headers, _ = await read_response(reader)
        assert (status, headers["connection"]) == (400, "close")
        assert await reader.read() == b""
        writer.close()


async def test_a_failing_handler_is_500_and_the_connection_lives_on() -> None:
    async with server() as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/boom", b"") + post("/after", b""))
        assert (await read_response(reader))[0] == 500
        assert (await read_response(reader))[2].startswith(b"POST /after")
        writer.close()


async def test_an_idle_connection_is_closed_after_keep_alive() -> None:
    async with server(keep_alive_s=0.2) as (srv, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/x", b""))
        await read_response(reader)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed it
        assert not srv.connections
        writer.close()


@pytest.mark.parametrize(
    "partial",
    [b"POST /x HTTP/1.1\r\nhost: t\r\n", post("/x", b"0123456789")[:-4]],
    ids=["headers", "body"],
)
async def test_a_request_that_stalls_half_way_is_408_and_closed(partial: bytes) -> None:
    async with server(keep_alive_s=0.1, stall_s=0.3) as (srv, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(partial)  # and nothing more
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        assert (status, headers["connection"]) == (408, "close")
        assert orjson.loads(body)["code"] == "request_timeout"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert not srv.connections
        writer.close()


async def test_a_slow_body_that_keeps_coming_is_not_cut() -> None:
    """Its head comes whole (a head must: test_http_server_limits.py), then its body two
    bytes at a time, each gap far inside stall_s and past keep_alive_s."""
    async with server(keep_alive_s=0.05, stall_s=0.6) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b"abcdefgh" * 6
        writer.write(post("/slow", b"").replace(b"length: 0", b"length: %d" % len(body)))
        for i in range(0, len(body), 2):  # 0.05 s a 2-byte piece: well over stall_s in all
            writer.write(body[i : i + 2])
            await asyncio.sleep(0.05)
        status, _, echoed = await asyncio.wait_for(read_response(reader), 5)
        assert (status, echoed) == (200, b"POST /slow 48 b'abcdefghabcdefgh'")
        writer.close()


async def test_stop_answers_the_request_in_flight_then_refuses_new_connections() -> None:
    srv = HttpServer(echo, max_body_bytes=LIMIT)
    port = await srv.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/slow?delay=0.3", b""))
    await asyncio.sleep(0.1)  # the request is in the handler
    await srv.stop(5.0)
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"]) == (200, "close")
    assert body.startswith(b"POST /slow")  # the answer is the slow request's, whole
    assert await idle_reader.read() == b""  # the idle one was closed at once
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    idle_writer.close()


# -- any requests, cut anywhere ------------------------------------------------------------


class FakeTransport:
    """What the protocol writes, and whether it paused reading or closed; a write after
    the close fails the test."""

    def __init__(self, protocol: HttpProtocol) -> None:
        self.protocol = protocol
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after the close"
        self.out += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def parse_responses(out: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every response in ``out``, which must hold whole responses and nothing else."""
    responses = []
    at = 0
    while at < len(out):
        head_end = out.index(b"\r\n\r\n", at)
        status_line, *lines = out[at:head_end].decode("latin-1").split("\r\n")
        assert status_line.startswith("HTTP/1.1 "), status_line
        headers = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        body = out[head_end + 4 : head_end + 4 + length]
        assert len(body) == length, "a response cut short"
        responses.append((int(status_line.split()[1]), headers, body))
        at = head_end + 4 + length
    return responses


def wire_request(method: str, path: str, body: bytes, chunk: int) -> bytes:
    """``chunk`` 0: the body framed by Content-Length; else sent chunked, ``chunk`` bytes a
    piece."""
    if chunk == 0:
        return post(path, body).replace(b"POST", method.encode(), 1)
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = f"{method} {path} HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
    return head.encode() + framed


async def serve_pieces(pieces: list[bytes]) -> FakeTransport:
    """Feed ``pieces`` to one connection as a loop would (reading stops while paused, and
    answers run between reads), then let the answers finish."""
    protocol = HttpProtocol(HttpServer(echo, max_body_bytes=LIMIT))
    transport = FakeTransport(protocol)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    for piece in pieces:
        for _ in range(100):
            if not transport.paused or transport.closed:
                break
            await asyncio.sleep(0)
        if transport.closed or transport.paused:
            break
        protocol.data_received(piece)
        await asyncio.sleep(0)
    for _ in range(100):  # the echo handler never waits: a few turns answer everything
        await asyncio.sleep(0)
    if not transport.closed:
        transport.close()  # the client goes; the idle timer must not outlive the loop
        await asyncio.sleep(0)
    return transport


_REQUESTS = st.lists(
    st.tuples(
        st.sampled_from(["GET", "POST", "PUT"]),
        st.from_regex(r"/[a-z0-9]{0,8}", fullmatch=True),
        st.one_of(st.binary(max_size=64), st.binary(min_size=LIMIT - 4, max_size=LIMIT + 4)),
        st.sampled_from([0, 0, 1, 7, 300]),
    ),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(
    _REQUESTS,
    st.one_of(st.none(), st.binary(max_size=40).map(lambda b: b"\x00" + b)),
    st.lists(st.integers(1, 4000), max_size=8),
)
def test_any_requests_and_garbage_cut_anywhere_get_their_answers_in_order(
    requests: list[tuple[str, str, bytes, int]], garbage: bytes | None, cuts: list[int]
) -> None:
    """Requests (framed by length or chunked, some over the body limit), then perhaps bytes
    that are not HTTP, cut into any pieces: each request under the limit gets its echo, in
    order, on the one connection; the first over it gets 413 and the close; garbage after
    whole requests gets 400 and the close; nothing else comes out, and no exception."""
    wire = b"".join(wire_request(*r) for r in requests) + (garbage or b"")
    at = sorted({c for c in cuts if c < len(wire)} | {0, len(wire)})
    pieces = [wire[a:b] for a, b in itertools.pairwise(at)]
    transport = asyncio.run(serve_pieces(pieces))

    expected: list[tuple[int, bytes | None]] = []
    for method, path, body, _ in requests:
        if len(body) > LIMIT:
            expected.append((413, None))
            break
        expected.append((200, f"{method} {path} {len(body)} {body[:16]!r}".encode()))
    else:
        if garbage is not None:
            expected.append((400, None))
    answers = parse_responses(bytes(transport.out))
    assert [status for status, _, _ in answers] == [status for status, _ in expected]
    for (_, _, body), (_, echoed) in zip(answers, expected, strict=True):
        if echoed is not None:
            assert body == echoed
    closes = [headers.get("connection") == "close" for _, headers, _ in answers]
    if answers:  # only an error answer closes, and it is the last
        assert closes == [False] * (len(answers) - 1) + [answers[-1][0] != 200]
