"""A model's ready probe for a model (or version) that is not loaded answers as a loaded
model that is not ready: 503 ``{"name", "ready": false}`` over HTTP, ``ready=false`` over
gRPC, as Triton answers both as not ready. The probe is open without the API key, so it
must not tell a loaded name from any other either. A malformed version stays 400.

One gateway on real Kafka and Redis; no worker runs, so the loaded model is not ready.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import tritonclient.grpc.aio as aioclient

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts

pytestmark = pytest.mark.timeout(120)

_NOT_READY = (
    ("identity", "/v2/models/identity/ready"),  # loaded, no live worker
    ("nope", "/v2/models/nope/ready"),
    ("nope", "/v2/models/nope/versions/1/ready"),
    ("identity", "/v2/models/identity/versions/9/ready"),  # a version not loaded
)


async def test_a_model_not_loaded_is_not_ready_as_a_loaded_one_without_a_worker(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity", api_key="s3cret")
    async with (
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        answers = [(name, await http.get(path)) for name, path in _NOT_READY]
        malformed = await http.get("/v2/models/nope/versions/1.5/ready")
        client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            grpc_known = await client.is_model_ready("identity")
            grpc_unknown = await client.is_model_ready("nope")
        finally:
            await client.close()

    for name, response in answers:
        assert response.status_code == 503, (name, response.text)
        assert response.json() == {"name": name, "ready": False}
    assert malformed.status_code == 400 and malformed.json()["code"] == "invalid_input"
    assert grpc_known is False and grpc_unknown is False
