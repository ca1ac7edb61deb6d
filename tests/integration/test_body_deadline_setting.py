"""``gateway.max_body_s`` reaches a running gateway: a body dripped past it gets 408 (the
gRPC server's own bound: tests/integration/test_grpc_message_deadline.py); 0 sets no
bound."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from plaza.gateway.http_server import body_bound_s
from plaza.settings import PlazaSettings
from tests.support import gateway_fronts


def test_zero_is_no_bound() -> None:
    assert body_bound_s(0) == math.inf
    assert body_bound_s(2.5) == 2.5


async def _drip_http(url: str) -> bytes:
    """A POST whose 1000-byte body comes a byte every 10 ms (the server's first look at a
    request still coming in is after its idle time, 5 s); what the server answered."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    answer = asyncio.create_task(reader.read(4096))  # the first bytes the server sends
    try:
        head = "POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
        writer.write(head.encode())
        for _ in range(1000):
            if answer.done():
                break
            writer.write(b" ")
            await asyncio.sleep(0.01)
        return await asyncio.wait_for(answer, 10)
    finally:
        answer.cancel()
        writer.close()


async def test_the_setting_bounds_an_http_body_of_a_running_gateway(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", host="127.0.0.1", max_body_s=0.5)
    async with gateway_fronts(settings) as running:
        answer = await _drip_http(running.http_url)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer
