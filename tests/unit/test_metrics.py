"""Exposition, the metrics HTTP server, the gateway's counters and the stats routes.

No Kafka, no Redis: registries are built per test (never the global one), servers listen on
free ports and are closed by the tests that open them.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from plaza.contract import InferRequest, InferResult
from plaza.errors import (
    Cancelled,
    ConfigError,
    DeadlineExceeded,
    InvalidInput,
    ModelNotFound,
    QueueFull,
)
from plaza.gateway.app import create_app
from plaza.gateway.metrics import GatewayMetrics, metered, serve_metrics
from plaza.gateway.service import GatewayService
from plaza.metrics import CONTENT_TYPE, MetricsServer, failure_reason, render
from plaza.settings import GatewaySettings, PlazaSettings
from tests.metrics_support import named, samples, value

_CONFIG = """
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
"""


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


# -- exposition -----------------------------------------------------------------------------


def test_counters_keep_triton_names_without_total_or_created() -> None:
    registry = CollectorRegistry()
    c = Counter("nv_inference_request_success", "ok", ["model", "version"], registry=registry)
    c.labels("m", "1").inc(3)
    text = render(registry).decode()
    assert "# TYPE nv_inference_request_success counter" in text
    assert 'nv_inference_request_success{model="m",version="1"} 3.0' in text
    assert "_total" not in text and "_created" not in text
    # and it is valid exposition: Prometheus' parser reads it back
    (family,) = text_string_to_metric_families(text)
    assert family.type == "counter" and family.samples[0].value == 3


def test_gauges_histograms_and_label_escaping() -> None:
    registry = CollectorRegistry()
    Gauge("g", "a gauge", ["name"], registry=registry).labels('a"b\\c\nd').set(2)
    h = Histogram("h", "a histogram", buckets=(1, 4), registry=registry)
    h.observe(3)
    text = render(registry).decode()
    assert 'g{name="a\\"b\\\\c\\nd"} 2.0' in text
    assert 'h_bucket{le="4.0"} 1.0' in text and "h_count 1.0" in text and "h_sum 3.0" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["g"].samples[0].labels["name"] == 'a"b\\c\nd'
    assert families["h"].type == "histogram"


def test_an_empty_registry_renders_nothing() -> None:
    assert render(CollectorRegistry()) == b""


def test_failure_reasons_are_tritons() -> None:
    assert failure_reason(QueueFull.code) == "REJECTED"
    assert failure_reason(DeadlineExceeded.code) == "REJECTED"
    assert failure_reason("model_error") == "BACKEND"
    assert failure_reason("model_error_not_found") == "BACKEND"  # a Python model's NOT_FOUND
    assert failure_reason(Cancelled.code) == "CANCELED"  # a model's TritonError.CANCELLED
    assert failure_reason(InvalidInput.code) == "OTHER"
    assert failure_reason("something new") == "OTHER"


# -- the server -----------------------------------------------------------------------------


def test_server_serves_its_own_registry_on_a_free_port() -> None:
    one, two = CollectorRegistry(), CollectorRegistry()
    Gauge("only_in_one", "x", registry=one).set(1)
    Gauge("only_in_two", "x", registry=two).set(2)
    with MetricsServer(one) as a, MetricsServer(two) as b:
        assert a.port != b.port and a.port > 0
        status, content_type, body = get(a.url)
        assert status == 200 and content_type == CONTENT_TYPE
        assert "only_in_one 1.0" in body and "only_in_two" not in body
        assert "only_in_two 2.0" in get(b.url)[2]
        assert get(f"http://127.0.0.1:{a.port}/other")[0] == 404
    MetricsServer(CollectorRegistry(), port=a.port).close()  # closed: the port is free again


def test_a_failing_collector_answers_500_and_the_server_keeps_serving() -> None:
    class Broken:
        def collect(self) -> Any:
            raise RuntimeError("boom")

    registry = CollectorRegistry()
    registry.register(Broken())
    with MetricsServer(registry) as server:
        status, _, body = get(server.url)
        assert status == 500 and "boom" in body
        assert get(server.url)[0] == 500  # still answering


def test_a_busy_port_is_a_config_error() -> None:
    with MetricsServer(CollectorRegistry()) as server, pytest.raises(ConfigError, match="metrics"):
        MetricsServer(CollectorRegistry(), port=server.port)


def test_nothing_lands_on_the_global_registry() -> None:
    GatewayMetrics().success.labels("m", "1").inc()
    GatewayMetrics().success.labels("m", "1").inc()  # a second one: no duplicate error
    names = {f.name for f in REGISTRY.collect()}
    assert not any(n.startswith(("nv_", "plaza_")) for n in names)


# -- the gateway's counters -----------------------------------------------------------------


class _Loaded:
    versions = (1, 3)


class _FakeService:
    """What ``metered`` needs of GatewayService: ``metrics`` and ``model()``."""

    def __init__(self, outcome: InferResult | Exception) -> None:
        self.metrics = GatewayMetrics()
        self.outcome = outcome

    def model(self, name: str, version: str = "") -> _Loaded:
        if name != "m" or version not in ("", "1", "3"):
            raise ModelNotFound(f"no {name} {version}")
        return _Loaded()

    @metered
    async def infer(self, req: InferRequest, timeout_s: float | None = None) -> InferResult:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def _req(model: str = "m", version: str = "") -> InferRequest:
    return InferRequest(id="r", model=model, version=version, inputs=())


async def test_gateway_counts_success_with_duration_and_failures_by_reason() -> None:
    ok = _FakeService(InferResult(id="r", model="m", version="3"))
    assert (await ok.infer(_req())).version == "3"
    await ok.infer(_req(version="3"), 1.0)
    ok.outcome = InferResult(id="r", model="m", version="1")
    await ok.infer(_req(version="1"))
    got = samples(render(ok.metrics.registry).decode())
    assert value(got, "nv_inference_request_success", model="m", version="3") == 2
    assert value(got, "nv_inference_request_success", model="m", version="1") == 1
    assert value(got, "nv_inference_request_duration_us", model="m", version="3") is not None

    failing = _FakeService(QueueFull("full"))
    for req in (_req(), _req(version="1"), _req(model="unknown"), _req(version="9")):
        with pytest.raises(QueueFull):
            await failing.infer(req)
    got = samples(render(failing.metrics.registry).decode())
    failure = "nv_inference_request_failure"
    assert value(got, failure, model="m", version="3", reason="REJECTED") == 1
    assert value(got, failure, model="m", version="1", reason="REJECTED") == 1
    assert len(named(got, failure)) == 2  # unknown ones are no labels


def test_serve_metrics_serves_the_apps_registry(tmp_path: Path) -> None:
    settings = PlazaSettings(repository=tmp_path, gateway=GatewaySettings(metrics_port=0))
    app = create_app(settings)
    app.state.service.metrics.success.labels("m", "1").inc()
    with serve_metrics(app, settings.gateway) as server:
        assert server is not None
        body = get(server.url)[2]
    assert 'nv_inference_request_success{model="m",version="1"} 1.0' in body
    with serve_metrics(app, GatewaySettings(metrics_port=-1)) as off:
        assert off is None
    busy = MetricsServer(CollectorRegistry())
    with busy, serve_metrics(app, GatewaySettings(metrics_port=busy.port)) as none:
        assert none is None  # a port taken: no metrics, no crash


# -- the statistics routes ------------------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    model = tmp_path / "tiny"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_CONFIG)
    (model / "1" / "model.onnx").write_bytes(b"not loaded by the gateway")
    settings = PlazaSettings(repository=tmp_path)
    service = GatewayService(settings)
    service.load_repository()
    return TestClient(create_app(settings, service))


def test_stats_routes_resolve_before_model_metadata(client: TestClient) -> None:
    # not started (no Redis): the stats handler answers 503, not "no model called stats"
    for path in ("/v2/models/stats", "/v2/models/tiny/stats", "/v2/models/tiny/versions/1/stats"):
        response = client.get(path)
        assert response.status_code == 503, (path, response.text)
        assert response.json()["code"] == "unavailable"
    for path in ("/v2/models/nope/stats", "/v2/models/tiny/versions/2/stats"):
        assert client.get(path).status_code == 404
    assert "statistics" in client.get("/v2").json()["extensions"]
