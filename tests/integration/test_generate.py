"""Triton's generate extension through the whole stack: a JSON body posted to the gateway's
own HTTP server, published to Kafka, run by a worker, answered through Redis."""

from __future__ import annotations

import httpx
import orjson
import pytest

from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker

pytestmark = pytest.mark.timeout(120)


async def test_generate_and_generate_stream(settings: PlazaSettings) -> None:
    async with (
        running_worker(settings, "identity"),
        running_worker(settings, "accumulate"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        plain = await http.post("/v2/models/identity/generate", json={"INPUT0": [1.5, -2, 3]})
        # top-level keys that are not inputs are parameters: here, Triton's sequence ones
        first = {"INPUT": 5, "sequence_id": 77, "sequence_start": True, "id": "step-1"}
        started = await http.post("/v2/models/accumulate/generate", json=first)
        streamed = await http.post(
            "/v2/models/accumulate/versions/1/generate_stream",
            json={"INPUT": [2], "sequence_id": 77, "sequence_end": True},
        )
        wrong = await http.post("/v2/models/identity/generate", json={"INPUT1": [1]})
        unknown = await http.post("/v2/models/nope/generate", json={"INPUT0": [1]})
        refused = await http.post(
            "/v2/models/accumulate/generate_stream", json={"INPUT": 1, "sequence_id": 77}
        )
        extensions = (await http.get("/v2")).json()["extensions"]
    assert plain.status_code == 200, plain.text
    assert plain.json() == {"model_name": "identity", "model_version": "1", "OUTPUT0": [1.5, -2, 3]}
    assert started.json() == {
        "model_name": "accumulate",
        "model_version": "1",
        "id": "step-1",
        "OUTPUT": 5,  # one value: the value itself
    }
    assert streamed.status_code == 200
    assert streamed.headers["content-type"] == "text/event-stream; charset=utf-8"
    data = streamed.content.removeprefix(b"data: ")
    assert streamed.content.startswith(b"data: ") and data.endswith(b"\n\n")
    assert orjson.loads(data)["OUTPUT"] == 7  # the sum went on from the generate call
    assert wrong.status_code == 400 and "'INPUT1' is not an input" in wrong.json()["error"]
    assert unknown.status_code == 404
    # an error is a JSON error with its status, not an event (the sequence ended above)
    assert refused.status_code == 400 and "has not started" in refused.json()["error"]
    assert refused.headers["content-type"].startswith("application/json")
    assert "generate" in extensions
