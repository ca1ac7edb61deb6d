"""The HTTP layer without Kafka or Redis: routing, auth, body limits, error bodies.

The service is built but never started (the test client runs no lifespan), so everything
here is answered before a request would be published.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from plaza.errors import InvalidInput, PayloadTooLarge
from plaza.gateway.app import create_app, decompress
from plaza.gateway.service import GatewayService
from plaza.settings import GatewaySettings, PlazaSettings

_CONFIG = """
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    model = tmp_path / "tiny"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_CONFIG)
    (model / "1" / "model.onnx").write_bytes(b"not loaded by the gateway")
    return tmp_path


def _client(repository: Path, api_key: str | None = None) -> TestClient:
    key = SecretStr(api_key) if api_key else None
    settings = PlazaSettings(
        repository=repository, gateway=GatewaySettings(max_body_bytes=1024, api_key=key)
    )
    service = GatewayService(settings)
    service.load_repository()
    return TestClient(create_app(settings, service))


def test_server_metadata_and_live(repository: Path) -> None:
    client = _client(repository)
    meta = client.get("/v2").json()
    assert meta["name"] == "plaza" and "binary_tensor_data" in meta["extensions"]
    assert client.get("/v2/health/live").status_code == 200


def test_model_metadata_and_config(repository: Path) -> None:
    client = _client(repository)
    meta = client.get("/v2/models/tiny").json()
    assert meta["versions"] == ["1"] and meta["inputs"][0]["shape"] == [-1, 2]
    assert client.get("/v2/models/tiny/versions/1").status_code == 200
    config = client.get("/v2/models/tiny/config").json()
    assert config["name"] == "tiny" and config["max_batch_size"] == 4


def test_unknown_model_version_and_route_are_json_404s(repository: Path) -> None:
    client = _client(repository)
    for path in ("/v2/models/nope", "/v2/models/tiny/versions/7", "/v2/models/tiny/versions/x"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.json()["code"] == "model_not_found"
    response = client.post("/v2/models/nope/infer", content=b"{}")
    assert response.status_code == 404
    assert client.get("/v3/nothing").json() == {"error": "Not Found", "code": "http_error"}


def test_bad_body_is_400_before_anything_is_published(repository: Path) -> None:
    client = _client(repository)
    response = client.post("/v2/models/tiny/infer", content=b"{not json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    bad_header = {"Inference-Header-Content-Length": "zz"}
    assert (
        client.post("/v2/models/tiny/infer", content=b"{}", headers=bad_header).status_code == 400
    )


def test_body_limit_is_413(repository: Path) -> None:
    client = _client(repository)
    response = client.post("/v2/models/tiny/infer", content=b" " * 2048)
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    chunks = iter([b" " * 600, b" " * 600])  # chunked: no Content-Length to trust
    assert client.post("/v2/models/tiny/jobs", content=chunks).status_code == 413


def test_unknown_job_without_redis_is_503(repository: Path) -> None:
    response = _client(repository).get("/v2/jobs/abc")
    assert response.status_code == 503 and response.json()["code"] == "unavailable"


def test_api_key_guards_all_but_health(repository: Path) -> None:
    client = _client(repository, api_key="s3cret")
    assert client.get("/v2/health/live").status_code == 200
    response = client.get("/v2")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"
    assert client.get("/v2", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/v2", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_decompress() -> None:
    data = b'{"inputs": []}' * 10
    assert decompress(gzip.compress(data), "gzip", 1000) == data
    assert decompress(zlib.compress(data), "deflate", 1000) == data
    with pytest.raises(PayloadTooLarge):
        decompress(gzip.compress(b"0" * 5000), "gzip", 1000)
    with pytest.raises(InvalidInput, match="not valid gzip"):
        decompress(b"plain", "gzip", 1000)
    with pytest.raises(InvalidInput, match="truncated"):
        decompress(gzip.compress(data)[:-12], "gzip", 1000)
    with pytest.raises(InvalidInput, match="unsupported Content-Encoding"):
        decompress(data, "br", 1000)
