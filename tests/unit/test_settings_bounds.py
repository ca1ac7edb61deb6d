"""Settings that cannot work are refused when read, naming the setting, not later deep in a
client: a port past 65535 (the server bound it modulo 65536, and listened elsewhere), a
Kafka request timeout of zero or less (the gateway failed to bootstrap from a Kafka that
was up). ``require_free`` refuses a port that is not one before binding it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from plaza.settings import PlazaSettings
from plaza.stack.errors import ServiceError
from plaza.stack.ports import require_free


@pytest.mark.parametrize(
    "env",
    [
        {"PLAZA_GATEWAY__HTTP_PORT": "70000"},
        {"PLAZA_GATEWAY__GRPC_PORT": "-1"},
        {"PLAZA_GATEWAY__METRICS_PORT": "65536"},
        {"PLAZA_KAFKA__REQUEST_TIMEOUT_MS": "0"},
        {"PLAZA_KAFKA__REQUEST_TIMEOUT_MS": "-5"},
    ],
)
def test_a_setting_that_cannot_work_is_refused(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    name = next(iter(env)).removeprefix("PLAZA_").lower().replace("__", ".")
    with pytest.raises(ValidationError, match=name.split(".")[-1]):
        PlazaSettings()


def test_the_edges_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAZA_GATEWAY__HTTP_PORT", "0")  # a free one
    monkeypatch.setenv("PLAZA_GATEWAY__METRICS_PORT", "-1")  # off
    monkeypatch.setenv("PLAZA_GATEWAY__GRPC_PORT", "65535")
    gw = PlazaSettings().gateway
    assert (gw.http_port, gw.metrics_port, gw.grpc_port) == (0, -1, 65535)


@pytest.mark.parametrize("port", [70000, -3])
def test_require_free_names_a_port_that_is_not_one(port: int) -> None:
    with pytest.raises(ServiceError, match="not TCP ports"):
        require_free([port], "the gateway")
