"""The metrics port reads ``Authorization`` as the gateway's routes do (``plaza.auth``).

No Kafka, no Redis: a metrics server on a free port and the gateway's Starlette app in a
test client, asked the same questions; each answer's status and challenge must agree.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from starlette.testclient import TestClient

from plaza.auth import bearer_matches
from plaza.gateway.app import create_app
from plaza.gateway.service import GatewayService
from plaza.metrics import MetricsServer
from plaza.settings import GatewaySettings, PlazaSettings

KEY = "s3cret"
ACCEPTED = ("Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR   s3cret", " Bearer s3cret")
REFUSED = (None, "", "Bearer", "Bearer nope", "Basic s3cret", "Bearers3cret", "s3cret")


@pytest.fixture
def metrics() -> Iterator[MetricsServer]:
    with MetricsServer(CollectorRegistry(), api_key=KEY) as server:
        yield server


@pytest.fixture
def gateway(tmp_path: Path) -> TestClient:
    settings = PlazaSettings(repository=tmp_path, gateway=GatewaySettings(api_key=SecretStr(KEY)))
    service = GatewayService(settings)
    service.load_repository()
    return TestClient(create_app(settings, service))


def _scrape(url: str, authorization: str | None) -> tuple[int, str | None]:
    """The status and the WWW-Authenticate header of one scrape."""
    headers = {} if authorization is None else {"Authorization": authorization}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as response:
            return int(response.status), response.headers.get("WWW-Authenticate")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("WWW-Authenticate")


@pytest.mark.parametrize("authorization", ACCEPTED)
def test_the_scheme_is_read_in_any_case(metrics: MetricsServer, authorization: str) -> None:
    assert _scrape(metrics.url, authorization) == (200, None)


@pytest.mark.parametrize("authorization", REFUSED)
def test_a_refusal_carries_the_challenge(metrics: MetricsServer, authorization: str | None) -> None:
    assert _scrape(metrics.url, authorization) == (401, "Bearer")


@pytest.mark.parametrize("authorization", ACCEPTED + REFUSED)
def test_the_metrics_port_answers_as_the_gateway_routes(
    metrics: MetricsServer, gateway: TestClient, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    route = gateway.get("/v2", headers=headers)
    assert _scrape(metrics.url, authorization) == (
        route.status_code,
        route.headers.get("WWW-Authenticate"),
    )


def test_bearer_matches() -> None:
    key = KEY.encode()
    assert all(bearer_matches(a.encode(), key) for a in ACCEPTED)
    assert not any(bearer_matches((a or "").encode(), key) for a in REFUSED)
    assert not bearer_matches(b"Bearer s3cret2", key)  # a longer key is another key
    assert not bearer_matches(b"Token s3cret", key)


def test_no_key_leaves_the_port_open() -> None:
    with MetricsServer(CollectorRegistry()) as server:
        assert _scrape(server.url, None) == (200, None)
        assert _scrape(server.url, "Bearer anything") == (200, None)
