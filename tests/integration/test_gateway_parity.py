"""Both fronts of a gateway with an API key as Triton answers: NaN and infinities in JSON,
the model-ready probes open, the auth scheme case-insensitive, a malformed version 400.

One gateway and one identity worker (real Kafka and Redis); HTTP through the gateway's own
server (its sync infer fast path and its bridge to the app), gRPC through tritonclient.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker, wait_for

_KEY = "s3cret"
_VALUES = [1.5, float("nan"), float("inf"), float("-inf")]


def _identity_body() -> bytes:
    # the tokens tritonclient (python-rapidjson) writes for these values
    return (
        b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], '
        b'"data": [1.5, NaN, Infinity, -Infinity]}]}'
    )


async def _grpc_error(call: Awaitable[Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        await call
    return info.value


async def test_http_and_grpc_agree_with_triton_on_auth_versions_and_non_finite_json(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", api_key=_KEY)
    async with (
        running_worker(settings, "identity"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        # model ready is a health probe (no key), as server live and ready
        async def model_ready() -> bool:
            return (await http.get("/v2/models/identity/ready")).status_code == 200

        await wait_for(model_ready, 60, "identity ready over HTTP without a key")
        versioned = await http.get("/v2/models/identity/versions/1/ready")
        named_ready = await http.get("/v2/models/ready")  # a model named "ready": guarded

        # the fast path: a 401 says which scheme; "bearer" in any case is that scheme
        refused = await http.post("/v2/models/identity/infer", content=_identity_body())
        lower = {"authorization": f"bearer {_KEY}"}
        answer = await http.post(
            "/v2/models/identity/infer", content=_identity_body(), headers=lower
        )
        bad_version = await http.post(
            "/v2/models/identity/versions/abc/infer", content=_identity_body(), headers=lower
        )
        missing_version = await http.post(
            "/v2/models/identity/versions/7/infer", content=_identity_body(), headers=lower
        )

        client = aioclient.InferenceServerClient(gw.grpc_address)
        upper = {"authorization": f"BEARER {_KEY}"}
        try:
            grpc_ready = await client.is_model_ready("identity")  # no key, as over HTTP
            item = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            item.set_data_from_numpy(np.array([_VALUES], dtype=np.float32))
            result = await client.infer("identity", [item], headers=upper)
            grpc_bad = await _grpc_error(
                client.infer("identity", [item], model_version="-1", headers=upper)
            )
            grpc_missing = await _grpc_error(
                client.infer("identity", [item], model_version="7", headers=upper)
            )
            ready_bad = await _grpc_error(client.is_model_ready("identity", "1.5"))
        finally:
            await client.close()

    assert versioned.status_code == 200
    assert named_ready.status_code == 401
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert answer.status_code == 200, answer.text
    assert b"[1.5,NaN,Infinity,-Infinity]" in answer.content  # not [1.5,null,null,null]
    (output,) = json.loads(answer.content)["outputs"]
    np.testing.assert_array_equal(output["data"], _VALUES)
    assert bad_version.status_code == 400 and bad_version.json()["code"] == "invalid_input"
    assert missing_version.status_code == 404
    assert grpc_ready
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([_VALUES], np.float32))
    assert grpc_bad.status() == ready_bad.status() == "StatusCode.INVALID_ARGUMENT"
    assert "integral value > 0" in grpc_bad.message()
    assert grpc_missing.status() == "StatusCode.NOT_FOUND"
