"""A sync HTTP infer whose client goes away (closes its socket, or half-closes it) is
cancelled as a cancelled gRPC call is: the gateway stops waiting at once, stores a
``cancelled`` answer, and the worker that fetches the request later skips it
(docs/gateway.md, "Errors"; the gRPC twin is in test_gateway_grpc.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import orjson

from plaza.gateway.main import Serving
from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker, wait_for


def infer_body(value: float) -> bytes:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [value] * 2}
    return orjson.dumps({"inputs": [tensor]})


def infer_request(value: float) -> bytes:
    body = infer_body(value)
    head = b"POST /v2/models/identity/infer HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


async def leave_mid_call(gw: Serving, value: float, half_close: bool) -> str:
    """Send a sync infer, leave once the gateway waits for it; its correlation id."""
    mux = await gw.service.producer.replies()
    _, writer = await asyncio.open_connection(*gw.http_url.split("//")[1].split(":"))
    writer.write(infer_request(value))
    await wait_for(lambda: mux.waiting == 1, 30, "the gateway to wait for the call")
    (correlation_id,) = mux._waiters
    if half_close:
        writer.write_eof()  # a FIN alone reads as the client gone, too
    else:
        writer.close()
    await wait_for(lambda: mux.waiting == 0, 30, "the gateway to stop waiting")
    writer.close()
    return correlation_id


async def test_a_client_that_leaves_a_sync_infer_cancels_it_and_the_worker_skips_it(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    # No worker at first: nothing answers, and the gateway would wait ten minutes on its own.
    settings = settings_for("identity", sync_timeout_s=600)
    async with gateway_fronts(settings) as gw:
        left = [await leave_mid_call(gw, 1.0, half_close) for half_close in (False, True)]
        producer = gw.service.producer

        async def stored() -> bool:
            return all([(await producer.poll(cid)).state == "done" for cid in left])

        await wait_for(stored, 30, "the cancelled answers")
        codes = []
        for cid in left:
            status = await producer.poll(cid)
            assert status.result is not None and status.result.error is not None
            codes.append(status.result.error.code)
        # ... so the worker that comes up skips both, and serves the next call.
        async with running_worker(settings, "identity") as worker:
            async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False) as client:
                answer = await client.post("/v2/models/identity/infer", content=infer_body(2.0))
            await wait_for(lambda: worker.metrics.records["skipped"] == 2, 30, "the skips")
    assert codes == ["cancelled", "cancelled"]
    assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2.0, 2.0]
    assert worker.metrics.records["written"] == 1  # the cancelled ones never ran
    assert worker.metrics.executions() == 1
