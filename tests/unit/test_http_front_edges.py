"""Edges of the HTTP front a reviewer found: a client that leaves mid-call (its handler is
cancelled, the calls queued behind it never run), a request target past httptools' limit
(414), HTTP/1.0 keep-alive (announced), a path with a trailing slash (a JSON 404, no
redirect), gzip bodies of several members or with bytes after the data, and BYTES outputs
that are not UTF-8 asked for as JSON (refused, not altered)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient

from plaza.contract import InferResult
from plaza.errors import InvalidInput
from plaza.gateway import kserve
from plaza.gateway.app import MAX_GZIP_MEMBERS, create_app, decompress
from plaza.gateway.http_server import MAX_URL_BYTES, HttpRequest, HttpResponse, HttpServer
from plaza.gateway.service import GatewayService
from plaza.settings import GatewaySettings, PlazaSettings
from plaza.tensors import Tensor
from tests.support import wait_for


class Recorder:
    """A handler that answers at once, but ``/hold`` waits until cancelled (recorded)."""

    def __init__(self) -> None:
        self.called: list[str] = []
        self.cancelled: list[str] = []

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.called.append(request.path)
        if request.path == "/hold":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(request.path)
                raise
        return HttpResponse(200, request.path.encode(), "text/plain")


@asynccontextmanager
async def serving(handler: Recorder) -> AsyncIterator[int]:
    srv = HttpServer(handler, max_body_bytes=1024)
    port = await srv.start("127.0.0.1", 0)
    try:
        yield port
    finally:
        await srv.stop(1.0)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status = int((await reader.readline()).split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers["content-length"]))


def get(path: str, version: str = "1.1", *extra: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/{version}", "host: t", *extra, "", ""]).encode()


# -- a client that leaves ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "half-close"])
async def test_a_client_that_leaves_cancels_its_call_and_the_ones_behind_never_run(
    how: str,
) -> None:
    handler = Recorder()
    async with serving(handler) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/hold") + get("/behind"))
        await wait_for(lambda: handler.called == ["/hold"], 10, "the call in flight")
        if how == "close":
            writer.close()
        else:
            writer.write_eof()
        await wait_for(lambda: handler.cancelled == ["/hold"], 10, "the call cancelled")
        writer.close()
        # the cancel ended the connection's answering in the same step: nothing after it ran
        assert handler.called == ["/hold"]


async def test_a_connection_that_stays_is_answered_after_a_sibling_left() -> None:
    handler = Recorder()
    async with serving(handler) as port:
        _, leaving = await asyncio.open_connection("127.0.0.1", port)
        leaving.write(get("/hold"))
        await wait_for(lambda: handler.called == ["/hold"], 10, "the call in flight")
        reader, staying = await asyncio.open_connection("127.0.0.1", port)
        leaving.close()
        await wait_for(lambda: handler.cancelled == ["/hold"], 10, "the call cancelled")
        staying.write(get("/here"))
        assert (await read_response(reader))[::2] == (200, b"/here")
        staying.close()


# -- request target over httptools' limit ------------------------------------------------


async def test_a_target_over_the_limit_is_414_and_the_connection_goes_on() -> None:
    handler = Recorder()
    async with serving(handler) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/" + "a" * MAX_URL_BYTES) + get("/next"))
        status, headers, body = await read_response(reader)
        assert (status, "connection" in headers) == (414, False)
        assert orjson.loads(body)["code"] == "uri_too_long"
        assert (await read_response(reader))[::2] == (200, b"/next")
        writer.close()
    assert handler.called == ["/next"]


async def test_a_target_httptools_cannot_split_is_400_and_the_connection_goes_on() -> None:
    async with serving(Recorder()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("http:///x") + get("/next"))
        status, _, body = await read_response(reader)
        assert (status, orjson.loads(body)["code"]) == (400, "http_error")
        assert (await read_response(reader))[::2] == (200, b"/next")
        writer.close()


# -- HTTP/1.0 keep-alive ------------------------------------------------------------------


async def test_http_1_0_keep_alive_is_announced_and_the_connection_kept() -> None:
    async with serving(Recorder()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path in ("/one", "/two"):
            writer.write(get(path, "1.0", "connection: keep-alive"))
            status, headers, body = await read_response(reader)
            assert (status, headers["connection"], body) == (200, "keep-alive", path.encode())
        writer.write(get("/last", "1.0"))  # no keep-alive asked: answered, then closed
        status, headers, _ = await read_response(reader)
        assert (status, headers["connection"]) == (200, "close")
        assert await reader.read() == b""
        writer.close()


async def test_http_1_1_answers_say_nothing_of_keep_alive() -> None:
    async with serving(Recorder()) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/x", "1.1", "connection: keep-alive"))
        assert "connection" not in (await read_response(reader))[1]
        writer.close()


# -- trailing slash -------------------------------------------------------------------------

_CONFIG = """
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
"""


@pytest.mark.parametrize("path", ["/v2/health/live/", "/v2/models/tiny/", "/v2/"])
def test_a_trailing_slash_is_a_json_404_not_a_redirect(tmp_path: Path, path: str) -> None:
    model = tmp_path / "tiny"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_CONFIG)
    (model / "1" / "model.onnx").write_bytes(b"not loaded by the gateway")
    settings = PlazaSettings(repository=tmp_path, gateway=GatewaySettings(max_body_bytes=1024))
    service = GatewayService(settings)
    service.load_repository()
    client = TestClient(create_app(settings, service), headers={"host": "evil.example"})
    answer = client.get(path, follow_redirects=False)
    assert answer.status_code == 404 and "location" not in answer.headers
    assert answer.json()["code"] == "http_error"


# -- compressed bodies ---------------------------------------------------------------------


def test_every_gzip_member_is_read() -> None:
    body = gzip.compress(b"first,") + gzip.compress(b"second")
    assert decompress(body, "gzip", 1000) == b"first,second"


def test_a_body_of_more_gzip_members_than_allowed_is_refused() -> None:
    """Each member's read copies what follows it: many tiny members would hold the loop
    for a time in the square of the body's size."""
    empty = gzip.compress(b"")
    assert decompress(empty * MAX_GZIP_MEMBERS, "gzip", 1000) == b""
    with pytest.raises(InvalidInput, match=f"more than {MAX_GZIP_MEMBERS} gzip members"):
        decompress(empty * (MAX_GZIP_MEMBERS + 1), "gzip", 1000)


def test_gzip_members_together_are_held_to_the_limit() -> None:
    with pytest.raises(Exception, match="over the limit"):
        decompress(gzip.compress(b"a" * 600) + gzip.compress(b"b" * 600), "gzip", 1000)


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(b"data") + b"junk"),
        ("gzip", gzip.compress(b"data") + b"\0\0\0\0"),
        ("deflate", zlib.compress(b"data") + b"junk"),
        ("deflate", zlib.compress(b"data") + zlib.compress(b"more")),
    ],
    ids=["gzip junk", "gzip zeros", "deflate junk", "deflate twice"],
)
def test_bytes_after_the_compressed_data_are_refused(encoding: str, body: bytes) -> None:
    with pytest.raises(InvalidInput):
        decompress(body, encoding, 1000)


# -- BYTES outputs in JSON ----------------------------------------------------------------


def _bytes_result(*items: bytes) -> InferResult:
    tensor = Tensor.from_numpy("S", np.array(list(items), dtype=object))
    return InferResult(id="corr", model="m", version="1", outputs=(tensor,))


def test_a_bytes_output_that_is_not_utf8_is_refused_in_json_not_altered() -> None:
    result = _bytes_result(b"ok", b"\xff\xfe\x00raw")
    with pytest.raises(InvalidInput, match=r"'S' element 1 is not valid UTF-8.*binary_data"):
        kserve.encode_infer_response(result, response_id="r", binary=lambda _: False)
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        kserve.result_doc(result, "j")


def test_a_bytes_output_that_is_not_utf8_is_intact_as_binary_data() -> None:
    result = _bytes_result(b"ok", b"\xff\xfe\x00raw")
    body = kserve.encode_infer_response(result, response_id="r", binary=lambda _: True)
    assert body.content.endswith(result.outputs[0].data)


def test_utf8_bytes_outputs_are_still_json_strings() -> None:
    body = kserve.encode_infer_response(
        _bytes_result("ü".encode(), b"x"), response_id="r", binary=lambda _: False
    )
    assert orjson.loads(body.content)["outputs"][0]["data"] == ["ü", "x"]
