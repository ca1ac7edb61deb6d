"""Shapes that declare far more elements than their data holds are 400s, never 500s.

A BYTES input with shape [1, 2**40] and no data once made the gateway (and the worker)
allocate an object array of that many elements: a MemoryError, or a ValueError past what
numpy can index. The sizes are now checked against the data first (plaza/tensors.py), so
the gateway answers 400 ``invalid_input`` before anything is published. The gateway runs
(its lifespan started) on the session's Kafka and Redis, so the request reaches the producer
core's validation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from plaza.gateway.app import create_app
from plaza.gateway.service import GatewayService
from plaza.settings import PlazaSettings
from tests.support import make_settings

_CONFIG = """
name: "words"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]
"""
HUGE = [2**40, 2**64 - 1, 2**62]


@pytest.fixture
def client(
    tmp_path: Path, kafka_bootstrap: str, redis_url: str, unique_id: str
) -> Iterator[TestClient]:
    model = tmp_path / "words"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_CONFIG)
    (model / "1" / "model.onnx").write_bytes(b"not loaded by the gateway")
    settings: PlazaSettings = make_settings(
        kafka_bootstrap, redis_url, unique_id, repository=tmp_path
    )
    service = GatewayService(settings)
    with TestClient(create_app(settings, service)) as started:  # runs the lifespan
        yield started


def _binary(shape: list[int], blob: bytes) -> tuple[bytes, dict[str, str]]:
    params = {"binary_data_size": len(blob)}
    header = orjson.dumps(
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": shape, "parameters": params}]}
    )
    return header + blob, {"Inference-Header-Content-Length": str(len(header))}


@pytest.mark.parametrize("width", HUGE)
@pytest.mark.parametrize("blob", [b"", b"\x01\x00\x00\x00a"], ids=["empty", "one element"])
def test_huge_bytes_shape_in_binary_body_is_400(
    client: TestClient, width: int, blob: bytes
) -> None:
    body, headers = _binary([1, width], blob)
    response = client.post("/v2/models/words/infer", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_input"
    assert "elements" in response.json()["error"]


@pytest.mark.parametrize("width", HUGE)
def test_huge_bytes_shape_in_json_body_is_400(client: TestClient, width: int) -> None:
    doc = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, width], "data": []}]}
    response = client.post("/v2/models/words/infer", content=orjson.dumps(doc))
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_input"
