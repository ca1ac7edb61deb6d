"""The HTTP layer without Kafka or Redis: routing, auth, body limits, error bodies.

The service is built but never started (the test client runs no lifespan), so everything
here is answered before a request would be published.
"""

from __future__ import annotations

import gzip
import re
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import cast

import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from plaza.errors import ConfigError, InvalidInput, PayloadTooLarge
from plaza.gateway.app import create_app, decompress, is_health_path
from plaza.gateway.main import exposure_warning
from plaza.gateway.metrics import serve_metrics
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
    # a version is named as its folder: "01" is not "1" (one version, one name in the
    # labels and statistics); "0" is an integer too, a version Triton has not loaded either
    versions = ("7", "01", "0", "9223372036854775807")
    for path in ["/v2/models/nope", *(f"/v2/models/tiny/versions/{v}" for v in versions)]:
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] == "model_not_found"
    assert client.get("/v2/models/tiny/versions/01/stats").status_code == 404
    response = client.post("/v2/models/nope/infer", content=b"{}")
    assert response.status_code == 404
    assert client.get("/v3/nothing").json() == {"error": "Not Found", "code": "http_error"}


# Triton's INVALID_ARG: "version should be an integral value > 0" (a digit of another
# script is none at all: it was a 500, then a 404); past int64 as Triton's std::stol
_BAD_VERSIONS = (
    "x",
    "abc",
    "-1",
    "1.5",
    "1e3",
    "+1",
    "%201",
    "%C2%B2",
    "%D9%A1",
    "1" * 5000,
    "9223372036854775808",
)


def test_a_malformed_version_is_400_on_every_route_that_takes_one(repository: Path) -> None:
    client = _client(repository)
    for version in _BAD_VERSIONS:
        for model in ("tiny", "nope"):  # judged before the model, as Triton parses it first
            base = f"/v2/models/{model}/versions/{version}"
            for method, path in [
                ("GET", base),
                ("GET", f"{base}/ready"),
                ("GET", f"{base}/config"),
                ("GET", f"{base}/stats"),
                ("POST", f"{base}/infer"),
                ("POST", f"{base}/jobs"),
            ]:
                response = client.request(method, path, content=b"{}")
                assert response.status_code == 400, (method, path)
                assert response.json()["code"] == "invalid_input"
                assert "integral value > 0" in response.json()["error"]


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


_PATH_VALUES = {"model": "tiny", "version": "1", "job_id": "abc", "name": "r0"}


def _every_route(app: Starlette) -> list[tuple[str, str]]:
    """(method, path) for every route the app serves, path parameters filled in."""
    calls = []
    for route in app.routes:
        assert isinstance(route, Route)
        path = re.sub(r"\{(\w+)\}", lambda m: _PATH_VALUES[m[1]], route.path)
        calls += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
    return calls


_OPEN_PATHS = {
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/tiny/ready",
    "/v2/models/tiny/versions/1/ready",
}
"""Triton's HEALTH category: server live and ready, a model's ready and a version's."""
_REFUSED_CREDENTIALS = ("", "Bearer nope", "s3cret", "Basic s3cret", "Bearers3cret", "Bearer")


def test_api_key_guards_every_route_but_health(repository: Path) -> None:
    client = _client(repository, api_key="s3cret")
    calls = _every_route(cast(Starlette, client.app))
    assert {p for _, p in calls if is_health_path(p)} == _OPEN_PATHS
    guarded = [(m, p) for m, p in calls if p not in _OPEN_PATHS]
    # The enumeration really covers the data plane, the jobs, statistics and metadata.
    for expected in ("/infer", "/jobs", "/v2/jobs/abc", "/stats", "/config", "/v2"):
        assert any(p.endswith(expected) for _, p in guarded), expected
    # a model named "ready": its metadata, and a version named so, are no health paths
    guarded += [("GET", "/v2/models/ready"), ("GET", "/v2/models/tiny/versions/ready")]
    for credentials in _REFUSED_CREDENTIALS:
        headers = {"Authorization": credentials} if credentials else {}
        for method, path in guarded:
            response = client.request(method, path, headers=headers, content=b"{}")
            assert response.status_code == 401, (method, path, headers)
            assert response.json()["code"] == "unauthorized"
            assert response.headers["WWW-Authenticate"] == "Bearer"  # RFC 7235
    # the scheme is case-insensitive (RFC 7235), with one or more spaces before the token
    for credentials in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):
        for method, path in guarded[:-2]:
            response = client.request(
                method, path, headers={"Authorization": credentials}, content=b"{}"
            )
            assert response.status_code not in (401, 500), (method, path, credentials)
    for path in _OPEN_PATHS:  # probes carry no key
        assert client.get(path).status_code != 401, path


@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_is_refused_at_start(repository: Path, key: str) -> None:
    """An empty key would let ``Authorization: Bearer `` in (a compose file's unset variable)."""
    settings = PlazaSettings(repository=repository, gateway=GatewaySettings(api_key=SecretStr(key)))
    with pytest.raises(ConfigError, match="api_key is empty"):
        create_app(settings)


def _scrape(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_api_key_guards_the_gateway_metrics(repository: Path) -> None:
    settings = PlazaSettings(
        repository=repository,
        gateway=GatewaySettings(metrics_port=0, api_key=SecretStr("s3cret")),
    )
    app = create_app(settings)
    with serve_metrics(app, settings.gateway) as server:
        assert server is not None
        assert _scrape(server.url, {}) == 401
        assert _scrape(server.url, {"Authorization": "Bearer nope"}) == 401
        assert _scrape(server.url, {"Authorization": "Bearer s3cret"}) == 200


def test_non_ascii_header_length_is_400(repository: Path) -> None:
    client = _client(repository)
    for value in (b"\xb2", b"\xb9\xb2"):  # latin-1 for superscript digits, which isdigit() passes
        headers = {b"Inference-Header-Content-Length": value}
        response = client.post("/v2/models/tiny/infer", content=b"{}", headers=headers)
        assert response.status_code == 400
        assert response.json()["code"] == "invalid_input"
        assert "must be an integer" in response.json()["error"]


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


@pytest.mark.parametrize(
    ("host", "key", "warned"),
    [
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", None, True),
        ("gateway.example", None, True),
        ("0.0.0.0", "s3cret", False),
    ],
)
def test_listening_beyond_loopback_without_a_key_is_warned(
    host: str, key: str | None, warned: bool
) -> None:
    gw = GatewaySettings(host=host, api_key=SecretStr(key) if key else None)
    warning = exposure_warning(gw)
    assert (warning is not None) == warned
    if warning is not None:
        assert host in warning and "api_key" in warning


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/cudasharedmemory/status"),
        ("GET", "/v2/cudasharedmemory/region/r/status"),
        ("POST", "/v2/cudasharedmemory/region/r/register"),
        ("POST", "/v2/cudasharedmemory/region/r/unregister"),
        ("POST", "/v2/cudasharedmemory/unregister"),
    ],
)
def test_cuda_shared_memory_routes_say_it_is_not_supported(
    repository: Path, method: str, path: str
) -> None:
    """As the gRPC calls do, by name: not an unknown route's 404."""
    response = _client(repository).request(method, path, content=b"{}")
    assert (response.status_code, response.json()["code"]) == (400, "unsupported")
    assert response.json()["error"] == "CUDA shared memory is not supported by Plaza"
