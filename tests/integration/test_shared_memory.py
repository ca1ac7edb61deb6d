"""Triton's system shared memory extension through the whole stack: tritonclient's own
shared memory helpers and its register, status and unregister calls over HTTP and gRPC, a
gateway, Kafka, a worker of the real mlp and Redis; each answer read back from the client's
output region and compared with the same request's answer sent in the body."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker

ROWS = 2
IN_BYTES = ROWS * 512 * 4
OUT_BYTES = ROWS * 10 * 4


@contextmanager
def region(byte_size: int) -> Iterator[tuple[str, Any]]:
    """A fresh POSIX shared memory object (its key and tritonclient's handle), destroyed
    on exit."""
    key = f"/plaza_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key.strip("/"), key, byte_size)
    try:
        yield key, handle
    finally:
        shm.destroy_shared_memory_region(handle)


def allowing_shm(settings: PlazaSettings, allowed: bool = True) -> PlazaSettings:
    gateway = settings.gateway.model_copy(update={"allow_client_shm": allowed})
    return settings.model_copy(update={"gateway": gateway})


async def test_inputs_and_outputs_in_shared_memory_over_http_and_grpc(
    settings: PlazaSettings,
) -> None:
    settings = allowing_shm(settings)
    x = np.random.default_rng(5).standard_normal((ROWS, 512)).astype(np.float32)
    with region(IN_BYTES) as (in_key, in_handle), region(2 * OUT_BYTES) as (out_key, out_handle):
        shm.set_shared_memory_region(in_handle, [x])
        async with running_worker(settings, "mlp"), gateway_fronts(settings) as gw:
            http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
            grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
            try:
                plain_in = http_aio.InferInput("input", [ROWS, 512], "FP32")
                plain_in.set_data_from_numpy(x)
                expected = (await http.infer("mlp", [plain_in])).as_numpy("logits")

                await http.register_system_shared_memory("in", in_key, IN_BYTES)
                await grpc.register_system_shared_memory("out", out_key, 2 * OUT_BYTES)
                status = await http.get_system_shared_memory_status()
                assert {r["name"]: (r["key"], r["byte_size"]) for r in status} == {
                    "in": (in_key, IN_BYTES),
                    "out": (out_key, 2 * OUT_BYTES),
                }
                assert "system_shared_memory" in (await http.get_server_metadata())["extensions"]

                h_in = http_aio.InferInput("input", [ROWS, 512], "FP32")
                h_in.set_shared_memory("in", IN_BYTES)
                h_out = http_aio.InferRequestedOutput("logits", binary_data=True)
                h_out.set_shared_memory("out", OUT_BYTES)
                over_http = await http.infer("mlp", [h_in], outputs=[h_out])
                # (a copy: the helper's array is a view of a mapping gone after the test)
                from_http = shm.get_contents_as_numpy(out_handle, np.float32, [ROWS, 10]).copy()
                assert over_http.get_output("logits")["shape"] == [ROWS, 10]

                # gRPC writes at an offset: the HTTP answer must stay where it was.
                g_in = grpc_aio.InferInput("input", [ROWS, 512], "FP32")
                g_in.set_shared_memory("in", IN_BYTES)
                g_out = grpc_aio.InferRequestedOutput("logits")
                g_out.set_shared_memory("out", OUT_BYTES, offset=OUT_BYTES)
                over_grpc = await grpc.infer("mlp", [g_in], outputs=[g_out])
                from_grpc = shm.get_contents_as_numpy(
                    out_handle, np.float32, [ROWS, 10], offset=OUT_BYTES
                ).copy()
                assert list(over_grpc.get_output("logits").shape) == [ROWS, 10]

                await grpc.unregister_system_shared_memory("in")
                left = await grpc.get_system_shared_memory_status()
                assert list(left.regions) == ["out"]
                with pytest.raises(InferenceServerException, match="not registered"):
                    await http.infer("mlp", [h_in], outputs=[h_out])
                await http.unregister_system_shared_memory()
                assert await http.get_system_shared_memory_status() == []
            finally:
                await http.close()
                await grpc.close()
    np.testing.assert_allclose(from_http, expected, rtol=1e-6)
    np.testing.assert_allclose(from_grpc, expected, rtol=1e-6)


async def test_shared_memory_errors_are_answered_not_crashed(settings: PlazaSettings) -> None:
    """A region too small for its output, a truncated object, a refused gateway: each a
    clear error, and the gateway keeps serving."""
    x = np.ones((ROWS, 512), np.float32)
    with region(IN_BYTES) as (in_key, in_handle), region(OUT_BYTES) as (out_key, _):
        shm.set_shared_memory_region(in_handle, [x])
        async with gateway_fronts(allowing_shm(settings, False)) as gw:
            http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
            try:
                with pytest.raises(InferenceServerException, match="allow_client_shm"):
                    await http.register_system_shared_memory("in", in_key, IN_BYTES)
            finally:
                await http.close()
        settings = allowing_shm(settings)
        async with running_worker(settings, "mlp"), gateway_fronts(settings) as gw:
            http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
            try:
                await http.register_system_shared_memory("in", in_key, IN_BYTES)
                await http.register_system_shared_memory("out", out_key, OUT_BYTES)
                with pytest.raises(InferenceServerException, match="already registered"):
                    await http.register_system_shared_memory("out", out_key, OUT_BYTES)
                with pytest.raises(InferenceServerException, match="past the end"):
                    await http.register_system_shared_memory("big", out_key, OUT_BYTES + 1)

                h_in = http_aio.InferInput("input", [ROWS, 512], "FP32")
                h_in.set_shared_memory("in", IN_BYTES)
                small = http_aio.InferRequestedOutput("logits", binary_data=True)
                small.set_shared_memory("out", OUT_BYTES // 2)
                with pytest.raises(InferenceServerException, match="byte size is"):
                    await http.infer("mlp", [h_in], outputs=[small])

                # the client shrinks its object behind the gateway's back
                os.truncate(f"/dev/shm/{in_key.strip('/')}", 16)
                with pytest.raises(InferenceServerException, match="shrank"):
                    await http.infer("mlp", [h_in])
                assert await http.is_server_live()
            finally:
                await http.close()


async def test_an_output_region_is_checked_before_the_request_is_published(
    settings: PlazaSettings,
) -> None:
    """No worker serves identity here: a request that got past its checks would be
    published and wait out its timeout (504). An output region not registered, or a place
    past its region's end, is refused at once instead (404 shared_memory_not_found, gRPC
    NOT_FOUND, as Triton's; 400 shared_memory, INVALID_ARGUMENT), and so is an async job
    asking for shared memory outputs."""
    settings = allowing_shm(settings)
    gateway = settings.gateway.model_copy(update={"sync_timeout_s": 5.0})
    settings = settings.model_copy(update={"gateway": gateway})
    item = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    places: list[dict[str, str | int]] = [
        {"shared_memory_region": "never", "shared_memory_byte_size": 16},
        {"shared_memory_region": "out", "shared_memory_byte_size": 16, "shared_memory_offset": 8},
    ]
    with region(16) as (out_key, _):
        async with gateway_fronts(settings) as gw, httpx.AsyncClient(timeout=30) as client:
            grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
            try:
                await grpc.register_system_shared_memory("out", out_key, 16)
                answers = []
                for params in places:
                    body = {
                        "inputs": [item],
                        "outputs": [{"name": "OUTPUT0", "parameters": params}],
                    }
                    answers.append(
                        await client.post(f"{gw.http_url}/v2/models/identity/infer", json=body)
                    )
                    g_in = grpc_aio.InferInput("INPUT0", [1, 4], "FP32")
                    g_in.set_data_from_numpy(np.ones((1, 4), np.float32))
                    g_out = grpc_aio.InferRequestedOutput("OUTPUT0")
                    g_out.set_shared_memory(
                        str(params["shared_memory_region"]),
                        16,
                        offset=int(params.get("shared_memory_offset", 0)),
                    )
                    invalid = "NOT_FOUND.*not registered|INVALID_ARGUMENT.*run past"
                    with pytest.raises(InferenceServerException, match=invalid):
                        await grpc.infer("identity", [g_in], outputs=[g_out])
                fits = {"shared_memory_region": "out", "shared_memory_byte_size": 16}
                job = {"inputs": [item], "outputs": [{"name": "OUTPUT0", "parameters": fits}]}
                answers.append(
                    await client.post(f"{gw.http_url}/v2/models/identity/jobs", json=job)
                )
            finally:
                await grpc.close()
    codes = [(a.status_code, a.json()["code"]) for a in answers]
    assert codes == [
        (404, "shared_memory_not_found"),
        (400, "shared_memory"),
        (400, "shared_memory"),
    ]
    assert "'never' is not registered" in answers[0].json()["error"]
    assert "run past shared memory region 'out'" in answers[1].json()["error"]
    assert "async job" in answers[2].json()["error"]
